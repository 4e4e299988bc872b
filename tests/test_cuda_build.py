"""nvcc toolchains, the compile cache, compiler feedback, the symbol audit and the harness program.

These run nvcc for real (about 2-3 s per kernel on 2 cores; the embedded suite compiles in one parallel
batch and stays in the compile cache across runs).
"""
import concurrent.futures
import multiprocessing
import subprocess

import numpy as np
import pytest

from kernels_eval import task as task_lib
from kernels_eval.cuda import audit
from kernels_eval.cuda import backend
from kernels_eval.cuda import compile as compile_lib
from kernels_eval.cuda import prototype
from kernels_eval.cuda import session
from kernels_eval.cuda import toolchain

SIG = prototype.CudaSignature(("x",), ("float32",), "float32", ("n",))
SCALE = """#include <cuda_runtime.h>
__global__ void scale(const float* x, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.0f * x[i];
}
extern "C" void solution(const float* x, float* out, int n, cudaStream_t stream) {
  scale<<<(n + 255) / 256, 256, 0, stream>>>(x, out, n);
}
"""


def _build(source: str, cache_dir, tc=None) -> compile_lib.CompileResult:
  return compile_lib.compile_source(source + SIG.entry_shim(), "sm_90", tc or toolchain.find_toolchain(),
                                    cache_dir=cache_dir, prototype=SIG.prototype())


@pytest.fixture(scope="session")
def suite_builds():
  tasks = [t for t in task_lib.load_tasks() if "cuda" in t.solutions]
  return tasks, backend.build_many(tasks, [t.solutions["cuda"] for t in tasks])


def test_embedded_suite_compiles_and_passes_the_audit(suite_builds):
  tasks, builds = suite_builds
  for task, build in zip(tasks, builds):
    assert build.ok, f"{task.id}: {build.feedback}"
    assert audit.audit_library(build.library, task.solutions["cuda"], ("solution", prototype.ENTRY_SYMBOL)) is None
    imports = audit.undefined_imports(build.library)
    assert "__cudaRegisterFatBinary" in imports and "__cudaLaunchKernel" in imports


def test_kernels_link_the_cuda_runtime_dynamically(suite_builds):
  _, builds = suite_builds
  needed = subprocess.run(["readelf", "-d", builds[0].library], capture_output=True, text=True, check=True).stdout
  assert toolchain.find_toolchain().cudart_soname in needed


def test_auto_toolchain_and_arch(monkeypatch):
  monkeypatch.delenv(toolchain.NVCC_ENV, raising=False)
  monkeypatch.setenv(toolchain.ARCH_ENV, "sm_80")
  tc = toolchain.find_toolchain()
  assert tc.version.startswith("13.")
  if toolchain.visible_gpu_arch() is None:
    assert toolchain.target_arch() == "sm_80"
    monkeypatch.delenv(toolchain.ARCH_ENV)
    assert toolchain.target_arch() == "sm_90"
  with pytest.raises(ValueError, match="sm_XY"):
    toolchain.target_arch("compute_90") if toolchain.visible_gpu_arch() is None else toolchain.find_toolchain("gcc")


def test_forced_pypi_nvcc_compiles(monkeypatch, tmp_path):
  monkeypatch.setenv(toolchain.NVCC_ENV, "pypi")
  tc = toolchain.find_toolchain()
  assert tc.origin == "pypi" and tc.version == "13.0.88"
  assert "site-packages" in tc.nvcc and tc.cudart_dir.endswith("lib")
  result = _build(SCALE, tmp_path, tc)
  assert result.ok, result.log
  assert audit.audit_library(result.library, SCALE, ("solution", prototype.ENTRY_SYMBOL)) is None
  system = toolchain.find_toolchain("auto")
  flags = compile_lib.nvcc_flags(tc, "sm_90")
  assert compile_lib.cache_key(SCALE, flags, tc) != compile_lib.cache_key(SCALE, flags, system) or system == tc
  monkeypatch.setenv(toolchain.NVCC_ENV, "clang")
  with pytest.raises(ValueError, match="clang"):
    toolchain.find_toolchain()


def _compile_in_process(cache_dir: str) -> bool:
  return _build(SCALE.replace("2.0f", "3.0f"), cache_dir).cache_hit


def test_cache_hit_skips_nvcc_and_is_shared_across_processes(tmp_path):
  ctx = multiprocessing.get_context("spawn")
  with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as pool:
    hits = list(pool.map(_compile_in_process, [str(tmp_path)] * 2))
  assert sorted(hits) == [False, True]
  again = _build(SCALE.replace("2.0f", "3.0f"), tmp_path)
  assert again.ok and again.cache_hit and again.seconds == 0.0
  assert len(list(tmp_path.glob("*/*.so"))) == 1


def test_compile_errors_name_candidate_lines(tmp_path):
  broken = SCALE.replace("out[i] = 2.0f * x[i];", "out[i] = 2.0f * x[i] + undefined_name;")
  result = _build(broken, tmp_path)
  assert not result.ok
  assert result.feedback.startswith('solution.cu:4: error: identifier "undefined_name" is undefined')
  assert str(tmp_path) not in result.feedback and "warning" not in result.feedback
  cached = _build(broken, tmp_path)
  assert cached.cache_hit and cached.feedback == result.feedback


def test_wrong_signature_names_the_prototype(tmp_path):
  result = _build(SCALE.replace("solution(const float* x", "solution(float* x"), tmp_path)
  assert not result.ok
  assert "does not match the required prototype" in result.feedback
  assert SIG.prototype() in result.feedback


def test_audit_rejects_forbidden_imports_that_slip_past_the_source_rules(tmp_path):
  # Compiled directly (the source rules would stop it first): the audit sees the real imports.
  source = """#include <cuda_runtime.h>
extern "C" int system(const char*);
static int spawn(void*, const void*, void* (*)(void*), void*) __attribute__((weakref("pthread_create")));
extern "C" void solution(const float* x, float* out, int n, cudaStream_t stream) {
  cudaStream_t side;
  cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  spawn(0, 0, 0, 0);
  system("true");
}
"""
  result = _build(source, tmp_path)
  assert result.ok, result.log
  rejection = audit.audit_library(result.library, source, ("solution", prototype.ENTRY_SYMBOL))
  assert rejection.reason == "forbidden_import"
  for name in ("system", "pthread_create", "cudaStreamCreateWithFlags"):
    assert name in rejection.message


def test_audit_allows_constant_memory_but_not_mutable_globals(tmp_path):
  constant = SCALE.replace("__global__", "__constant__ float kScale[2] = {2.0f, 3.0f};\n__global__").replace(
      "2.0f * x[i]", "kScale[0] * x[i]")
  result = _build(constant, tmp_path)
  assert result.ok, result.log
  assert audit.audit_library(result.library, constant, ("solution", prototype.ENTRY_SYMBOL)) is None
  missing = audit.audit_library(result.library, constant, ("solution", "not_exported"))
  assert missing.reason == "missing_entry_point"


def test_runner_program_builds_and_reports_the_missing_gpu(tmp_path):
  runner = compile_lib.build_runner()
  lib = _build(SCALE, tmp_path).library
  trials = [[np.arange(5, dtype=np.float32)], [np.ones(5, np.float32)]]
  with session.RunnerSession(runner, lib, trials, (5,), np.float32, [5]) as s:
    if toolchain.visible_gpu_arch() is not None:
      reply = s.check()
      np.testing.assert_array_equal(reply.outputs[0], 2 * trials[0][0])
      assert reply.launches == 3 and reply.foreign_streams == 0 and reply.mutated == []
    else:
      with pytest.raises(session.RunnerFailure) as e:
        s.check()
      assert e.value.kind == "no_device"
