"""nvcc toolchains, preprocessing, the compile cache, compiler feedback, the symbol audit and the harness
program.

These run nvcc for real (about 2-3 s per kernel on 2 cores; the embedded suite compiles in one parallel
batch and stays in the compile cache across runs).
"""
import concurrent.futures
import dataclasses
import os
import multiprocessing
import subprocess
import sys

import numpy as np
import pytest

from kernels_eval import jail
from kernels_eval import task as task_lib
from kernels_eval.cuda import audit
from kernels_eval.cuda import backend
from kernels_eval.cuda import compile as compile_lib
from kernels_eval.cuda import prototype
from kernels_eval.cuda import session
from kernels_eval.cuda import static_check
from kernels_eval.cuda import toolchain
from kernels_eval.hardening import cuda_cases

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


EX_LAUNCH = SCALE.replace("  scale<<<(n + 255) / 256, 256, 0, stream>>>(x, out, n);\n", """\
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3((n + 255) / 256);
  config.blockDim = dim3(256);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchKernelEx(&config, scale, x, out, n);
""")


def _exports(path: str) -> set[str]:
  return audit.dynamic_symbols(path)[1]


def test_runner_links_the_runtime_by_soname_with_the_pip_toolchain(monkeypatch, tmp_path):
  monkeypatch.setenv(toolchain.NVCC_ENV, "pypi")
  tc = toolchain.find_toolchain()
  assert not os.path.exists(os.path.join(tc.cudart_dir, "libcudart.so"))  # what `-cudart shared` needed
  runner = compile_lib.build_runner(tc, cache_dir=tmp_path)
  dynamic = subprocess.run(["readelf", "-d", runner], capture_output=True, text=True, check=True).stdout
  assert f"[{tc.cudart_soname}]" in dynamic and f"[{tc.cudart_dir}]" in dynamic
  assert audit.OBSERVED_LAUNCHES <= _exports(runner)


def test_every_launch_symbol_of_the_runtime_is_observed_or_refused():
  tc = toolchain.find_toolchain()
  runtime = os.path.join(tc.cudart_dir, tc.cudart_soname)
  launches = {name for name in _exports(runtime) if "Launch" in name}
  assert {"cudaLaunchKernelExC", "__cudaLaunchKernel_ptsz", "cudaLaunchCooperativeKernel"} <= launches
  observed = _exports(compile_lib.build_runner(tc))
  for name in launches:
    assert name in observed or not audit.is_allowed_import(name), name
  assert audit.OBSERVED_LAUNCHES <= observed


def test_a_launch_through_cudaLaunchKernelEx_passes_every_static_stage(tmp_path):
  tc = toolchain.find_toolchain()
  assert static_check.check_source(EX_LAUNCH) is None
  pre = compile_lib.preprocess(EX_LAUNCH + SIG.entry_shim(), tc, "sm_90")
  assert pre.reason is None
  for text in (pre.host, pre.device):
    assert static_check.check_preprocessed(text, tc.root, pre.log) is None
  result = _build(EX_LAUNCH, tmp_path)
  assert result.ok, result.log
  assert audit.audit_library(result.library, pre.host, ("solution", prototype.ENTRY_SYMBOL)) is None
  assert "cudaLaunchKernelExC" in audit.undefined_imports(result.library)


@pytest.mark.parametrize("source,launch", [(SCALE, "__cudaLaunchKernel_ptsz"), (EX_LAUNCH, "cudaLaunchKernelExC_ptsz")])
def test_per_thread_stream_launches_pass_the_audit(tmp_path, source, launch):
  # Only nvcc's flag reaches these symbols (the source's own #define comes after nvcc's cuda_runtime.h).
  tc = toolchain.find_toolchain()
  result = compile_lib.compile_source(source + SIG.entry_shim(), tc=tc, cache_dir=tmp_path, prototype=SIG.prototype(),
                                      flags=[*compile_lib.nvcc_flags(tc, "sm_90"), "-default-stream", "per-thread"])
  assert result.ok, result.log
  assert launch in audit.undefined_imports(result.library)
  assert audit.audit_library(result.library, source, ("solution", prototype.ENTRY_SYMBOL)) is None


def test_nvidia_smi_runs_once_per_process_tree(tmp_path, monkeypatch):
  calls = tmp_path / "calls"
  smi = tmp_path / "nvidia-smi"
  smi.write_text(f'#!/bin/sh\necho run >> {calls}\nprintf "9.0\\n8.6\\n"\n')
  smi.chmod(0o755)
  monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
  monkeypatch.setenv(toolchain.GPU_ARCHS_ENV, "")
  monkeypatch.delenv(toolchain.GPU_ARCHS_ENV)
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  assert [toolchain.visible_gpu_arch() for _ in range(3)] == ["sm_90"] * 3
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
  assert toolchain.visible_gpu_arch() == toolchain.target_arch() == "sm_86"
  child = subprocess.run([sys.executable, "-c", "from kernels_eval.cuda import toolchain; "
                          "print(toolchain.visible_gpu_arch())"], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert child.stdout.strip() == "sm_86"
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
  assert toolchain.visible_gpu_arch() is None
  assert calls.read_text().splitlines() == ["run"]
  smi.write_text(f"#!/bin/sh\necho run >> {calls}\nexit 9\n")
  monkeypatch.delenv(toolchain.GPU_ARCHS_ENV)
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
  assert toolchain.visible_gpu_arch() is None and toolchain.visible_gpu_arch() is None
  assert os.environ[toolchain.GPU_ARCHS_ENV] == "none" and calls.read_text().splitlines() == ["run", "run"]


def test_compile_feedback_never_quotes_other_files():
  log = ('/usr/include/x.h(3): error: identifier "root_secret" is undefined\n  root_secret:x:0:0\n  ^\n'
         "In file included from solution.cu:2:\n/etc/shadow:1:5: error: expected ';' before ':' token\n"
         "    1 | root:$6$hash:19000\n      |     ^\n"
         "solution.cu:7:3: error: 'nope' was not declared in this scope\n    7 |   nope();\n      |   ^~~~\n"
         "some stray line with root_secret\nptxas error   : Entry function uses too much shared data\n")
  text = compile_lib.trim_log(log)
  assert 'x.h: error: identifier "..." is undefined' in text and "shadow: error: expected" in text
  assert "root" not in text and "stray" not in text
  assert "solution.cu:7: error: 'nope' was not declared" in text and "    7 |   nope();" in text
  assert text.endswith("ptxas error   : Entry function uses too much shared data")
  assert compile_lib.trim_log("fatal: something odd\n") == "nvcc failed without an error located in solution.cu"


def test_nvcc_runs_with_the_scrubbed_environment_only(tmp_path, monkeypatch):
  monkeypatch.setenv("KERNELS_EVAL_TEST_SECRET", "1")
  tc = toolchain.find_toolchain()
  probe = dataclasses.replace(tc, nvcc="/usr/bin/env")
  if os.geteuid() == 0:
    os.chown(tmp_path, compile_lib.JAIL_UID, compile_lib.JAIL_UID)  # the jail's identity enters the job folder
  out = compile_lib.run_nvcc(probe, [], str(tmp_path), timeout_s=30, limits=compile_lib.PREPROCESS_LIMITS,
                             jailed=True).stdout
  env = dict(line.split("=", 1) for line in out.splitlines())
  assert env == {"PATH": "/usr/bin:/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path), "LANG": "C",
                 "CUDA_HOME": tc.root}


def test_preprocessing_matches_nvccs_own_host_and_device_passes(tmp_path):
  tc = toolchain.find_toolchain()
  source = SCALE.replace("out[i] = 2.0f", "out[i] = HOST_OR_DEVICE").replace(
      "__global__", "#ifdef __CUDA_ARCH__\n#define HOST_OR_DEVICE 3.0f\n#else\n#define HOST_OR_DEVICE 2.0f\n#endif\n"
      "__global__") + SIG.entry_shim()
  pre = compile_lib.preprocess(source, tc, "sm_90")
  assert pre.reason is None and "3.0f" in pre.device and "3.0f" not in pre.host
  (tmp_path / "solution.cu").write_text(source)
  subprocess.run([tc.nvcc, *compile_lib.nvcc_flags(tc, "sm_90"), "-keep", "-keep-dir", str(tmp_path), "solution.cu",
                  "-o", "lib.so"], cwd=tmp_path, env=tc.env(str(tmp_path)), check=True, capture_output=True)
  assert (tmp_path / "solution.cpp4.ii").read_text() == pre.host
  assert (tmp_path / "solution.cpp1.ii").read_text() == pre.device


def _cases(*names: str) -> dict[str, str]:
  return {c.name: c.source for c in cuda_cases.CASES if c.name in {f"cuda_{n}" for n in names}}


SECOND_LAYER = {  # case -> what the preprocessed rules say (host pass, device pass), without the raw rules
    "system_digraph_paste": ("host_syscall", "host_syscall"),
    "exit_parenthesised": ("host_syscall", "host_syscall"),
    "exit_macro": ("host_syscall", "host_syscall"),
    "exit_pointer": ("host_syscall", "host_syscall"),
    "builtin_exit": ("forbidden_builtin", "forbidden_builtin"),
    "constructor_gnu_attribute": ("forbidden_attribute", "forbidden_attribute"),
    "constructor_dunder": ("forbidden_attribute", "forbidden_attribute"),
    "init_array_section": ("forbidden_attribute", "forbidden_attribute"),
    "managed_result_cache": ("forbidden_attribute", "forbidden_attribute"),
    "line_relabel_digraph": ("forbidden_preprocessor", "forbidden_preprocessor"),
    "line_relabel": ("forbidden_preprocessor", "forbidden_preprocessor"),
    "line_marker": ("forbidden_preprocessor", "forbidden_preprocessor"),
    "raw_string_lexer": ("forbidden_preprocessor", "forbidden_preprocessor"),
    "pragma_macro": ("forbidden_preprocessor", "forbidden_preprocessor"),
    "arch_host_path": ("host_syscall", None),
    "arch_device_asm": (None, "inline_asm"),
    "include_proc_environ": ("forbidden_include", "forbidden_include"),
}


def test_preprocessed_rules_catch_what_the_source_rules_catch():
  tc = toolchain.find_toolchain()
  task = next(t for t in task_lib.load_tasks() if t.id == cuda_cases.TASK_ID)
  cases = _cases(*SECOND_LAYER)
  assert len(cases) == len(SECOND_LAYER)
  for name, source in cases.items():
    full, _ = backend.shimmed_source(task, source)
    pre = compile_lib.preprocess(full, tc, "sm_90")
    got = tuple(getattr(static_check.check_preprocessed(text, tc.root, pre.log), "reason", None)
                for text in (pre.host, pre.device))
    assert pre.reason is None and got == SECOND_LAYER[name.removeprefix("cuda_")], (name, got, pre.reason)


def test_preprocessor_failures_reject(monkeypatch):
  tc = toolchain.find_toolchain()
  bomb = _cases("preprocessor_bomb")["cuda_preprocessor_bomb"]
  assert compile_lib.preprocess(bomb, tc, "sm_90").reason == "preprocess_too_large"
  error = compile_lib.preprocess(SCALE.replace("__global__", "#error no\n__global__"), tc, "sm_90")
  assert error.reason == "preprocess_error" and error.feedback.startswith("solution.cu:2: error: #error no")
  assert compile_lib.preprocess(SCALE, tc, "sm_90", timeout_s=0.01).reason == "preprocess_timeout"
  task = next(t for t in task_lib.load_tasks() if t.id == cuda_cases.TASK_ID)

  def fails(error: Exception):
    def preprocess(*args, **kwargs):
      raise error
    return preprocess

  monkeypatch.setattr(compile_lib, "preprocess", fails(ValueError("a checker bug")))
  assert backend.static_check(task, task.solutions["cuda"]).reason == "static_check_failed"
  monkeypatch.setattr(compile_lib, "preprocess", fails(jail.IsolationUnavailable("no namespaces")))
  with pytest.raises(jail.IsolationUnavailable):
    backend.static_check(task, task.solutions["cuda"])


def test_an_included_host_file_is_never_echoed(tmp_path):
  secret = tmp_path / "notes.h"
  secret.write_text("root_secret_token:x:0:0 more_secret_words\n")
  tc = toolchain.find_toolchain()
  source = SCALE.replace("#include <cuda_runtime.h>", f'#define NOTES "{secret}"\n#include NOTES')
  pre = compile_lib.preprocess(source + SIG.entry_shim(), tc, "sm_90")
  assert pre.reason == "preprocess_error" and "secret" not in pre.feedback + pre.log  # outside nvcc's jail
  compiled = _build(source, tmp_path)
  assert not compiled.ok and "secret" not in compiled.feedback and "notes.h" in compiled.feedback


def test_audit_rejects_load_time_code_and_accepts_the_toolchains_own(tmp_path, suite_builds):
  _, builds = suite_builds
  assert audit.load_time_code(builds[0].library) == []
  source = SCALE.replace("__global__", "struct Warm { Warm() { cudaGetLastError(); } };\nstatic Warm warm;\n"
                         "__attribute__((destructor)) static void late() { cudaGetLastError(); }\n__global__")
  result = _build(source, tmp_path)
  assert result.ok, result.log
  rejection = audit.audit_library(result.library, source, ("solution", prototype.ENTRY_SYMBOL))
  assert rejection.reason == "load_time_code"
  assert "_GLOBAL__sub_I_" in rejection.message and "_ZL4latev" in rejection.message


def test_audit_takes_constants_from_the_preprocessed_text_only(tmp_path):
  tc = toolchain.find_toolchain()
  fake = SCALE.replace("__global__", "#if 0\n__constant__ float cache[1];\n#endif\nstatic float cache[1];\n"
                       "namespace other { __constant__ float hits[1]; }\nstatic float hits[1];\n__global__").replace(
      "scale<<<", "cache[0] += hits[0] += 1;\n  scale<<<")
  result = _build(fake, tmp_path)
  assert result.ok, result.log
  pre = compile_lib.preprocess(fake + SIG.entry_shim(), tc, "sm_90")
  assert audit.constant_names(pre.host) == audit.constant_names(fake) == set()
  rejection = audit.audit_library(result.library, pre.host, ("solution", prototype.ENTRY_SYMBOL))
  assert rejection.reason == "mutable_global_state" and "_ZL5cache" in rejection.message
  honest = SCALE.replace("__global__", "__constant__ float kScale[1] = {2.0f};\n__global__")
  assert audit.constant_names(compile_lib.preprocess(honest, tc, "sm_90").host) == {"kScale"}
