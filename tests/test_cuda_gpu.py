"""CUDA candidates on a GPU: trusted solutions come out correct and timed; every launch path is counted; the
harness times by the one method and dies with its owner (skipped without a GPU)."""
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from kernels_eval import evaluator as evaluator_lib
from kernels_eval import sandbox
from kernels_eval import task as task_lib
from kernels_eval.cuda import audit
from kernels_eval.cuda import compile as compile_lib
from kernels_eval.cuda import gpu_job
from kernels_eval.cuda import prototype
from kernels_eval.cuda import session as session_lib
from kernels_eval.cuda import toolchain

TASKS = ("add", "silu_fp16", "softmax_row", "matmul")
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SIG = prototype.CudaSignature(("x",), ("float32",), "float32", ("n",))
KERNEL = """#include <cuda_runtime.h>
__global__ void scale(const float* x, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.0f * x[i];
}
"""
CHEVRONS = "  scale<<<(n + 255) / 256, 256, 0, stream>>>(x, out, n);\n"
EX = ("  cudaLaunchConfig_t config = {};\n  config.gridDim = dim3((n + 255) / 256);\n  config.blockDim = dim3(256);\n"
      "  config.stream = stream;\n  cudaLaunchKernelEx(&config, scale, x, out, n);\n")
C_API = ("  void* args[] = {(void*)&x, (void*)&out, (void*)&n};\n"
         "  cudaLaunchKernel((const void*)scale, dim3((n + 255) / 256), dim3(256), args, 0, stream);\n")
PER_THREAD = ("-default-stream", "per-thread")
LAUNCH_PATHS = [  # (launch code, extra nvcc flags, the runtime symbol it imports)
    (CHEVRONS, (), "__cudaLaunchKernel"), (EX, (), "cudaLaunchKernelExC"), (C_API, (), "cudaLaunchKernel"),
    (CHEVRONS, PER_THREAD, "__cudaLaunchKernel_ptsz"), (EX, PER_THREAD, "cudaLaunchKernelExC_ptsz"),
    (C_API, PER_THREAD, "cudaLaunchKernel_ptsz"),
]
OWNER = """
import sys
import numpy as np
from kernels_eval.cuda import session
if sys.argv[3] == "without-setpriv":
  session._setpriv = lambda: None
s = session.RunnerSession(sys.argv[1], sys.argv[2], [[np.zeros(256, np.float32)]], (256,), np.float32, [256])
print(s.proc.pid, flush=True)
s.check(timeout_s=600)
"""


def _library(launch: str, tmp_path, flags=(), kernel: str = KERNEL) -> str:
  """The candidate `kernel` + solution() running `launch`, compiled directly (no source rules)."""
  tc = toolchain.find_toolchain()
  entry = 'extern "C" void solution(const float* x, float* out, int n, cudaStream_t stream) {\n'
  source = kernel + entry + launch + "}\n"
  result = compile_lib.compile_source(source + SIG.entry_shim(), tc=tc, cache_dir=tmp_path, prototype=SIG.prototype(),
                                      flags=[*compile_lib.nvcc_flags(tc, toolchain.target_arch()), *flags])
  assert result.ok, result.log
  assert audit.audit_library(result.library, source, ("solution", prototype.ENTRY_SYMBOL)) is None
  return result.library


def _running(pid: int) -> bool:
  try:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
  except (FileNotFoundError, ProcessLookupError):
    return False


@pytest.mark.gpu
def test_trusted_cuda_solutions_are_correct_and_timed():
  embedded = {t.id: t for t in task_lib.load_tasks()}
  requests = [evaluator_lib.EvalRequest(embedded[i], embedded[i].solutions["cuda"], "cuda", "full") for i in TASKS]
  limits = sandbox.Limits(file_bytes=1 << 30, address_space_limit=False)
  with evaluator_lib.Evaluator(workers=2, limits=limits) as ev:
    results = ev.evaluate_many(requests)
  for task_id, r in zip(TASKS, results):
    assert r.status == "correct", f"{task_id}: {r.feedback}"
    assert r.trials_passed == r.trials_total == 5
    assert r.timing is not None and r.timing.kernel_ms > 0 and r.timing.reference_ms > 0


@pytest.mark.gpu
def test_wrong_cuda_output_is_reported_with_mismatches():
  task = {t.id: t for t in task_lib.load_tasks()}["add"]
  wrong = task.solutions["cuda"].replace("x[i] + y[i]", "x[i] - y[i]")
  with evaluator_lib.Evaluator(workers=1, limits=sandbox.Limits(address_space_limit=False)) as ev:
    r = ev.evaluate(evaluator_lib.EvalRequest(task, wrong, "cuda", "correctness"))
  assert r.status == "wrong_output" and r.first_mismatches and r.mismatch_count > 0


@pytest.mark.gpu
@pytest.mark.parametrize("launch,flags,symbol", LAUNCH_PATHS)
def test_every_launch_path_is_counted_and_timed(tmp_path, launch, flags, symbol):
  library = _library(launch, tmp_path, flags)
  assert symbol in audit.undefined_imports(library)
  n = 1 << 20
  rng = np.random.default_rng(0)
  sets = [[rng.normal(size=n).astype(np.float32)] for _ in range(3)]
  with session_lib.RunnerSession(compile_lib.build_runner(), library, sets, (n,), np.float32, [n]) as s:
    reply = s.check()
    assert (reply.launches, reply.foreign_streams, reply.mutated) == (4, 0, [])  # 3 trials + the determinism rerun
    for out, (x,) in zip(reply.outputs, sets):
      np.testing.assert_array_equal(out, 2 * x)
    timed = s.time(gpu_job.calls_per_round(len(sets)), 2, 3, timeout_s=120)
  assert len(timed.ms) == 3 and all(np.isfinite(timed.ms)) and timed.timed_set == 0
  np.testing.assert_array_equal(timed.timed_output, 2 * sets[0][0])


@pytest.mark.gpu
def test_timing_restores_the_inputs_before_every_call(tmp_path):
  kernel = KERNEL.replace("out[i] = 2.0f * x[i];", "{ out[i] = x[i] + 1.0f; ((float*)x)[i] = x[i] + 1.0f; }")
  library = _library(CHEVRONS, tmp_path, kernel=kernel)
  sets = [[np.arange(4096, dtype=np.float32) * (s + 1)] for s in range(3)]
  with session_lib.RunnerSession(compile_lib.build_runner(), library, sets, (4096,), np.float32, [4096]) as s:
    timed = s.time(7, 3, 2, timeout_s=120)
  assert timed.timed_set == 0
  np.testing.assert_array_equal(timed.timed_output, sets[0][0] + 1)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["with-setpriv", "without-setpriv"])
def test_a_spinning_harness_dies_with_the_process_that_owns_its_session(tmp_path, mode):
  if mode == "with-setpriv" and session_lib._setpriv() is None:
    pytest.skip("no setpriv with --pdeathsig on this host")
  spin = KERNEL.replace("if (i < n)", "for (volatile int spin = 1; spin;) {}\n  if (i < n)")
  library = _library(CHEVRONS, tmp_path, kernel=spin)
  owner = subprocess.Popen([sys.executable, "-c", OWNER, compile_lib.build_runner(), library, mode],
                           stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                           env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
  harness = None
  try:
    harness = int(owner.stdout.readline())
    time.sleep(5)  # CUDA set up, the kernel spinning
    assert _running(harness) and owner.poll() is None
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 5
    while _running(harness) and time.monotonic() < deadline:
      time.sleep(0.05)
    assert not _running(harness), "the harness outlived the process that owned its session"
  finally:
    owner.kill()
    owner.wait()
    if harness is not None and _running(harness):
      os.kill(harness, signal.SIGKILL)


@pytest.mark.gpu
def test_a_cudaLaunchKernelEx_candidate_is_judged_correct_and_timed():
  task = {t.id: t for t in task_lib.load_tasks()}["add"]
  source = task.solutions["cuda"].replace(
      "  elementwise_kernel<<<(size + 255) / 256, 256, 0, stream>>>(x, y, out, size);\n",
      "  cudaLaunchConfig_t config = {};\n  config.gridDim = dim3((size + 255) / 256);\n"
      "  config.blockDim = dim3(256);\n  config.stream = stream;\n  cudaLaunchKernelEx(&config, elementwise_kernel, x, y, out, size);\n")
  assert "cudaLaunchKernelEx" in source
  limits = sandbox.Limits(file_bytes=1 << 30, address_space_limit=False)
  with evaluator_lib.Evaluator(workers=1, limits=limits) as ev:
    r = ev.evaluate(evaluator_lib.EvalRequest(task, source, "cuda", "full"))
  assert r.status == "correct", r.feedback
  assert r.timing is not None and r.timing.kernel_ms > 0
