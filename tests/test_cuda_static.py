"""Source rules for CUDA candidates (no compiler involved)."""
import pytest

from kernels_eval import render
from kernels_eval import task as task_lib
from kernels_eval.cuda import prototype
from kernels_eval.cuda import static_check

HEAD = '#include <cuda_runtime.h>\n'
ENTRY = 'extern "C" void solution(const float* x, float* out, int n, cudaStream_t stream) {\n%s\n}\n'


def _src(body: str, head: str = "") -> str:
  return HEAD + head + ENTRY % body


@pytest.mark.parametrize("body,head,reason", [
    ('system("ls");', "", "host_syscall"),
    ('sys\\\ntem("ls");', "", "host_syscall"),
    ('CAT(sys, tem)("ls");', "#define CAT(a, b) a##b\n", "forbidden_preprocessor"),
    ("", "#pragma GCC optimize(\"O0\")\n", "forbidden_preprocessor"),
    ('asm("trap;");', "", "inline_asm"),
    ("float* p; cudaMalloc(&p, 4);", "", "memory_allocation"),
    ("float* p = new float[4];", "", "memory_allocation"),
    ("cudaStream_t s; cudaStreamCreate(&s);", "", "extra_stream"),
    ("fork();", "", "host_thread"),
    ("std::thread t;", "", "host_thread"),
    ("cudaEvent_t e;", "", "timer_tampering"),
    ("cudaDeviceSynchronize();", "", "timer_tampering"),
    ("cuLaunchKernel(0);", "", "timer_tampering"),
    ("cublasSgemm(0);", "", "library_call"),
    ("thrust::fill(out, out + n, 0.f);", "", "library_call"),
    ("cudaMemcpy(out, x, 4, cudaMemcpyDeviceToDevice);", "", "forbidden_api"),
    ("", 'static int f(const char*) __attribute__((weakref("system")));\n', "forbidden_attribute"),
    ("", "#include <stdio.h>\n", "forbidden_include"),
    ("", '#include "../../etc/passwd"\n', "forbidden_include"),
])
def test_rules_reject(body, head, reason):
  rejection = static_check.check_source(_src(body, head))
  assert rejection is not None and rejection.reason == reason, rejection


def test_rule_reports_line_numbers():
  rejection = static_check.check_source(_src('\n\n  system("ls");'))
  assert rejection.reason == "host_syscall" and rejection.line == 5
  assert "line 5" in rejection.feedback()


def test_comments_and_strings_do_not_trigger_rules():
  body = ('// system("rm -rf /"); malloc(4);\n  /* asm("trap;"); fork(); */\n'
          '  const char* s = "cudaMalloc(";\n  (void)s;')
  assert static_check.check_source(_src(body)) is None


def test_allowed_includes_and_pragma_unroll_pass():
  head = "#include <cuda_fp16.h>\n#include <cmath>\n#include <stdint.h>\n"
  body = "#pragma unroll\n  for (int i = 0; i < 4; ++i) {}\n  cudaMemsetAsync(out, 0, 4, stream);"
  assert static_check.check_source(_src(body, head)) is None


def test_missing_or_empty_entry_point():
  assert static_check.check_source("").reason == "empty_source"
  no_c = HEAD + "void solution(const float* x, float* out, int n, cudaStream_t s) {}\n"
  assert static_check.check_source(no_c).reason == "missing_entry_point"


def test_embedded_solutions_pass_and_prototypes_match_render():
  tasks = [t for t in task_lib.load_tasks() if "cuda" in t.solutions]
  assert len(tasks) >= 20
  for task in tasks:
    assert static_check.check_source(task.solutions["cuda"]) is None, task.id
    assert prototype.signature_from_task(task).prototype() == render.cuda_prototype(task)


def test_signature_rejects_unknown_dtype():
  with pytest.raises(ValueError, match="float64"):
    prototype.CudaSignature(("x",), ("float64",), "float32", ("n",))


def test_entry_shim_casts_every_argument():
  sig = prototype.CudaSignature(("a", "b"), ("float16", "int32"), "bfloat16", ("m", "k"))
  shim = sig.entry_shim()
  assert "(const __half*)buffers[0]" in shim and "(const int*)buffers[1]" in shim
  assert "(__nv_bfloat16*)buffers[2]" in shim and "dims[0], dims[1], stream" in shim
  assert sig.prototype() == ('extern "C" void solution(const __half* a, const int* b, __nv_bfloat16* out, '
                             "int m, int k, cudaStream_t stream);")
