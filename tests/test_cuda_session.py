"""The harness session and the CUDA job's GPU stages without a GPU: stand-ins for the harness program, and the
real harness program on a simulated CUDA runtime."""
import contextlib
import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from kernels_eval import gpu_lock
from kernels_eval import timing
from kernels_eval.cuda import compile as compile_lib
from kernels_eval.cuda import gpu_job
from kernels_eval.cuda import session as session_lib
from kernels_eval.cuda import toolchain

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
TRIALS = [[np.arange(4, dtype=np.float32)]]
OWNER = """
import sys, time
import numpy as np
from kernels_eval.cuda import session
s = session.RunnerSession(sys.argv[1], "candidate.so", [[np.zeros(4, np.float32)]], (4,), np.float32, [4])
print(s.proc.pid, s.dir, flush=True)
time.sleep(120)
"""


def _stand_in(tmp_path: pathlib.Path, body: str) -> str:
  """An executable standing in for the harness program (called as `runner <lib> <job_dir> <reply_fd>`)."""
  path = tmp_path / "runner"
  path.write_text(body)
  path.chmod(0o755)
  return str(path)


def _running(pid: int) -> bool:
  """True while `pid` exists and is not a zombie."""
  try:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
  except (FileNotFoundError, ProcessLookupError):
    return False


def _wait(condition, timeout_s: float) -> bool:
  deadline = time.monotonic() + timeout_s
  while not condition():
    if time.monotonic() > deadline:
      return False
    time.sleep(0.05)
  return True


@pytest.mark.skipif(session_lib._setpriv() is None, reason="no setpriv with --pdeathsig on this host")
def test_the_harness_dies_with_the_process_that_owns_its_session(tmp_path):
  runner = _stand_in(tmp_path, f'#!/bin/sh\nprintf %s "${session_lib.PARENT_ENV}" > "$2/parent"\nexec sleep 120\n')
  owner = subprocess.Popen([sys.executable, "-c", OWNER, runner], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                           env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)})
  harness = None
  try:
    pid, job_dir = owner.stdout.readline().split()
    harness = int(pid)
    parent = pathlib.Path(job_dir) / "parent"
    assert _wait(lambda: parent.exists() and parent.read_text(), 10)
    assert parent.read_text() == str(owner.pid)  # what runner.cu's own parent-death guard checks
    time.sleep(0.5)
    assert _running(harness)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert _wait(lambda: not _running(harness), 2), "the harness outlived the process that owned its session"
  finally:
    owner.kill()
    owner.wait()
    if harness is not None and _running(harness):
      os.kill(harness, signal.SIGKILL)


def test_time_sends_calls_warmup_and_rounds_and_reads_one_value_per_round(tmp_path):
  runner = _stand_in(tmp_path, f"""#!{sys.executable}
import os, sys
import numpy as np
job_dir, reply = sys.argv[2], int(sys.argv[3])
for line in sys.stdin:
  if line.startswith("time"):
    open(os.path.join(job_dir, "command"), "w").write(line)
    np.full(4, 7.0, np.float32).tofile(os.path.join(job_dir, "timed.bin"))
    os.write(reply, b"ok time set=0 ms=0.5,0.25,0.75\\n")
""")
  with session_lib.RunnerSession(runner, "candidate.so", TRIALS, (4,), np.float32, [4]) as s:
    reply = s.time(7, 3, 3, timeout_s=30)
    assert (s.dir / "command").read_text() == "time 7 3 3\n"
  assert reply.ms == [0.5, 0.25, 0.75] and reply.timed_set == 0
  np.testing.assert_array_equal(reply.timed_output, np.full(4, 7.0, np.float32))


def test_a_hanging_harness_is_killed_at_the_deadline(tmp_path):
  runner = _stand_in(tmp_path, "#!/bin/sh\nexec sleep 120\n")
  s = session_lib.RunnerSession(runner, "candidate.so", TRIALS, (4,), np.float32, [4])
  try:
    with pytest.raises(session_lib.RunnerFailure) as e:
      s.check(timeout_s=0.5)
    assert e.value.kind == "timeout" and s.proc.returncode == -signal.SIGKILL
  finally:
    s.close()


class _Locks:
  """Stand-ins for `gpu_lock.shared`/`exclusive` that record what is held and refuse nesting."""

  def __init__(self):
    self.held: str | None = None

  @contextlib.contextmanager
  def hold(self, kind: str):
    assert self.held is None, f"{kind} taken while {self.held} is held"
    self.held = kind
    try:
      yield
    finally:
      self.held = None


def test_checks_hold_the_gpu_lock_shared_and_the_timing_exclusive(monkeypatch):
  locks, events, emitted = _Locks(), [], []
  out = np.zeros(4, np.float32)

  class FakeSession:
    def __init__(self, *args, **kwargs):
      events.append(f"{locks.held}: start")

    def check(self, timeout_s):
      events.append(f"{locks.held}: check")
      return session_lib.CheckReply([out], out, [], launches=1, foreign_streams=0)

    def time(self, calls, warmup, rounds, timeout_s):
      events.append(f"{locks.held}: time {calls} {warmup} {rounds}")
      return session_lib.TimeReply([0.3, -0.01, 0.2, 0.5, 0.1], 0, out)

    def close(self):
      events.append(f"{locks.held}: close")

  monkeypatch.setattr(gpu_lock, "shared", lambda: locks.hold("shared"))
  monkeypatch.setattr(gpu_lock, "exclusive", lambda: locks.hold("exclusive"))
  monkeypatch.setattr(session_lib, "RunnerSession", FakeSession)
  monkeypatch.setattr(gpu_job, "_out_struct", lambda payload, inputs: ((4,), np.dtype(np.float32)))
  x = [np.ones(4, np.float32)]
  payload = {"task": {"input_names": ["x"], "dim_names": ["n"]}, "input_dtypes": ["float32"],
             "trial_dims": [{"n": 4}, {"n": 8}], "trials": [x, x], "timing_trials": [x, x, x],
             "timing_dims": {"n": 4}}
  sig = gpu_job.signature(payload)
  assert gpu_job._check(payload, sig, "runner", "lib.so", None, emitted.append)
  assert gpu_job._time(payload, sig, "runner", "lib.so", emitted.append)
  calls = gpu_job.calls_per_round(3)
  assert events == ["shared: start", "shared: check", "shared: close"] * 2 + [
      "exclusive: start", f"exclusive: time {calls} {gpu_job.TIMING_WARMUP} {gpu_job.TIMING_ROUNDS}",
      "exclusive: close"]
  frame = emitted[-1]
  assert frame["kind"] == "timing" and frame["kernel_ms"] == 0.2
  assert frame["samples"]["kernel_ms"] == [0.3, timing.RESOLUTION_MS, 0.2, 0.5, 0.1]


@pytest.mark.parametrize("n_sets", range(1, 9))
def test_the_last_timed_call_of_a_round_is_on_the_first_set(n_sets):
  calls = gpu_job.calls_per_round(n_sets)
  assert calls >= 1 and (calls - 1) % n_sets == 0 and calls <= gpu_job.TIMING_CALLS


LAUNCH_MS, COPY_MS = 0.25, 0.001
# A CUDA runtime on host memory with a simulated device clock: every copy or memset takes COPY_MS, every
# kernel launch LAUNCH_MS, and an event records the clock.
STUB_RUNTIME = """#include <cuda_runtime_api.h>
#include <cstdlib>
#include <cstring>
namespace {
double g_clock = 0;
int g_stream;
cudaError_t Tick(double ms) { g_clock += ms; return cudaSuccess; }
}
extern "C" {
cudaError_t cudaGetDeviceCount(int* n) { *n = 1; return cudaSuccess; }
cudaError_t cudaStreamCreate(cudaStream_t* s) { *s = reinterpret_cast<cudaStream_t>(&g_stream); return cudaSuccess; }
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr, int) { *value = 1 << 16; return cudaSuccess; }
cudaError_t cudaMalloc(void** p, size_t n) { *p = std::malloc(n); return cudaSuccess; }
cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
  std::memcpy(d, s, n);
  return Tick(%(copy)s);
}
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) {
  std::memcpy(d, s, n);
  return Tick(%(copy)s);
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) { std::memset(p, v, n); return Tick(%(copy)s); }
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaGetLastError() { return cudaSuccess; }
const char* cudaGetErrorName(cudaError_t) { return "cudaErrorStub"; }
const char* cudaGetErrorString(cudaError_t) { return "stub"; }
cudaError_t cudaEventCreate(cudaEvent_t* e) { *e = reinterpret_cast<cudaEvent_t>(new double(0)); return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  *reinterpret_cast<double*>(e) = g_clock;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = static_cast<float>(*reinterpret_cast<double*>(b) - *reinterpret_cast<double*>(a));
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) { delete reinterpret_cast<double*>(e); return cudaSuccess; }
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t*, const void*, void**) { return Tick(%(launch)s); }
}
""" % {"copy": COPY_MS, "launch": LAUNCH_MS}
# The candidate's entry point, host code only: the simulated device memory is host memory.
STUB_CANDIDATE = """#include <cuda_runtime_api.h>
static void kernel() {}
extern "C" void kernels_eval_call(void* const* buffers, const int* dims, cudaStream_t stream) {
  float* x = static_cast<float*>(buffers[0]);
  float* out = static_cast<float*>(buffers[1]);
  for (int i = 0; i < dims[0]; ++i) {
#ifdef MUTATE
    out[i] = x[i] + 1.0f;
    x[i] += 1.0f;
#else
    out[i] = 2.0f * x[i];
#endif
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1);
  config.blockDim = dim3(1);
  config.stream = stream;
  cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(kernel), nullptr);
}
"""


def _nvcc_host(tc: toolchain.Toolchain, folder: pathlib.Path, source: str, out: str, *flags: str) -> str:
  (folder / f"{out}.cc").write_text(source)
  subprocess.run([tc.nvcc, "-x", "c++", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-cudart", "none", *flags,
                  f"{out}.cc", "-o", out], cwd=folder, env=tc.env(str(folder)), check=True, capture_output=True)
  return str(folder / out)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
  """(runner, candidate library, mutating candidate library), all on the simulated runtime."""
  folder = tmp_path_factory.mktemp("simulated")
  tc = toolchain.find_toolchain()
  (folder / "cudart.map").write_text(f"{tc.cudart_soname} {{ global: *; }};\n")
  _nvcc_host(tc, folder, STUB_RUNTIME, tc.cudart_soname, "-Xlinker", f"-soname={tc.cudart_soname}",
             "-Xlinker", "--version-script=cudart.map")
  stub_tc = dataclasses.replace(tc, cudart_dir=str(folder))
  link = (f"-L{folder}", f"-l:{tc.cudart_soname}", "-Xlinker", f"-rpath={folder}")
  runner = compile_lib.compile_source((pathlib.Path(compile_lib.__file__).parent / "runner.cu").read_text(),
                                      tc=stub_tc, cache_dir=folder, flags=compile_lib.runner_flags(stub_tc),
                                      suffix=".exe", private_dir=folder)
  assert runner.ok, runner.log
  return (runner.library, _nvcc_host(tc, folder, STUB_CANDIDATE, "candidate.so", *link),
          _nvcc_host(tc, folder, STUB_CANDIDATE, "mutating.so", "-DMUTATE", *link))


def _sets(n: int = 64) -> list[list[np.ndarray]]:
  return [[np.arange(n, dtype=np.float32) * (s + 1)] for s in range(3)]


def test_the_harness_counts_launches_and_times_by_the_one_method(simulated):
  runner, candidate, _ = simulated
  sets = _sets()
  with session_lib.RunnerSession(runner, candidate, sets, (64,), np.float32, [64]) as s:
    check = s.check(timeout_s=30)
    timed = s.time(7, 2, 3, timeout_s=30)
  assert (check.launches, check.foreign_streams, check.mutated) == (4, 0, [])  # 3 sets + the determinism rerun
  for out, (x,) in zip(check.outputs, sets):
    np.testing.assert_array_equal(out, 2 * x)
  # (device time of 7 x [prep; call] - that of 7 x [prep]) / 7: the launch alone, whatever prep costs.
  assert timed.ms == pytest.approx([LAUNCH_MS] * 3, rel=1e-4)
  assert timed.timed_set == 0
  np.testing.assert_array_equal(timed.timed_output, 2 * sets[0][0])


def test_the_harness_restores_the_inputs_before_every_timed_call(simulated):
  runner, _, mutating = simulated
  sets = _sets()
  with session_lib.RunnerSession(runner, mutating, sets, (64,), np.float32, [64]) as s:
    check = s.check(timeout_s=30)
    timed = s.time(4, 3, 2, timeout_s=30)
  assert check.mutated == [(0, 0), (1, 0), (2, 0)]
  np.testing.assert_array_equal(check.determinism, sets[0][0] + 1)  # inputs restored after the check
  assert timed.timed_set == 0
  np.testing.assert_array_equal(timed.timed_output, sets[0][0] + 1)
