"""Source rules for CUDA candidates (no compiler involved)."""
import pytest

from kernels_eval import render
from kernels_eval import task as task_lib
from kernels_eval.cuda import audit
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
    ("", '#define F "/etc/shadow"\n#include F\n', "forbidden_include"),
    ("", '%:include "/etc/shadow"\n', "forbidden_include"),
    ("", "#include_next <math.h>\n", "forbidden_preprocessor"),
    ('CAT(sys, tem)("ls");', "#define CAT(a, b) a %:%: b\n", "forbidden_preprocessor"),
    ("(exit)(0);", "", "host_syscall"),
    ("void (*f)(int) = &exit;", "", "host_syscall"),
    ("auto f = exit; f(0);", "", "host_syscall"),
    ("std::exit(0);", "", "host_syscall"),
    ('sys\\  \ntem("ls");', "", "host_syscall"),
    ("int k = 0x1'2'/*';\n  system(\"ls\");", "", "host_syscall"),
    ("__builtin_exit(0);", "", "forbidden_builtin"),
    ("__cxa_atexit(0, 0, 0);", "", "host_syscall"),
    ("", "[[gnu::constructor]] static void f() {}\n", "forbidden_attribute"),
    ("", "<:<:gnu::constructor:>:> static void f() {}\n", "forbidden_attribute"),
    ("", "[[using gnu: constructor]] static void f() {}\n", "forbidden_attribute"),
    ("", "__attribute__((used, constructor)) static void f() {}\n", "forbidden_attribute"),
    ("", "__attribute__((__constructor__)) static void f() {}\n", "forbidden_attribute"),
    ("", "__attribute((destructor)) static void f() {}\n", "forbidden_attribute"),
    ("", 'static void f() {}\n__attribute__((section(".init_array"))) static void (*p)() = f;\n',
     "forbidden_attribute"),
    ("", "__attribute__((aligned(16), visibility(\"default\"))) int v;\n", "forbidden_attribute"),
    ("", '#line 1 "/usr/include/math.h"\n', "forbidden_preprocessor"),
    ("", '%:line 1 "/usr/include/math.h"\n', "forbidden_preprocessor"),
    ("", '# 1 "/usr/include/math.h" 1 3 4\n', "forbidden_preprocessor"),
    ("", "#define __constant__\n", "forbidden_preprocessor"),
    ("", "#undef __CUDA_ARCH__\n", "forbidden_preprocessor"),
    ("", '#define P _Pragma("GCC optimize(\\"O0\\")")\n', "forbidden_preprocessor"),
    ("", "#if __has_include(</etc/shadow>)\n#endif\n", "forbidden_preprocessor"),
    ("", 'static const char* s = R"x(" /* )x";\n', "forbidden_preprocessor"),
    ("cudaLaunchKernel_ptsz((void*)0, 1, 1, 0, 0, stream);", "", "forbidden_api"),
    ("cudaLaunchKernel((void*)0, 1, 1, 0, 0, stream);", "", "forbidden_api"),
    ("cudaLaunchDevice(0, 0, 1, 1, 0, stream);", "", "forbidden_api"),
    ('void* f; cudaGetDriverEntryPoint("cuLaunchKernel", &f, 0, 0);', "", "forbidden_api"),
    ("cudaLaunchCooperativeKernel((void*)0, 1, 1, 0, 0, stream);", "", "extra_stream"),
])
def test_rules_reject(body, head, reason):
  rejection = static_check.check_source(_src(body, head))
  assert rejection is not None and rejection.reason == reason, rejection


def test_cudaLaunchKernelEx_with_a_config_and_attributes_passes():
  head = "__global__ void k(const float* x, float* out, int n) { out[0] = x[0]; }\n"
  body = ("  cudaLaunchAttribute attrs[1];\n  attrs[0].id = cudaLaunchAttributeCooperative;\n"
          "  attrs[0].val.cooperative = 1;\n  cudaLaunchConfig_t config = {};\n  config.gridDim = dim3(1);\n"
          "  config.blockDim = dim3(32);\n  config.stream = stream;\n  config.attrs = attrs;\n  config.numAttrs = 1;\n"
          "  cudaLaunchKernelEx(&config, k, x, out, n);\n  cudaLaunchKernelExC(&config, (const void*)k, nullptr);")
  assert static_check.check_source(_src(body, head)) is None


def test_the_audit_allows_exactly_the_launches_the_harness_observes():
  assert {"__cudaLaunchKernel", "cudaLaunchKernelExC"} <= audit.OBSERVED_LAUNCHES
  assert all(audit.is_allowed_import(name) for name in audit.OBSERVED_LAUNCHES)
  for name in ("cudaLaunchCooperativeKernel", "cudaLaunchHostFunc", "cudaGraphLaunch", "cudaLaunchDevice",
               "__cudaLaunchSomethingNew", "__cudaGetProcAddress", "cudaGetDriverEntryPoint", "cuLaunchKernel"):
    assert not audit.is_allowed_import(name), name
  assert audit.is_allowed_import("__cudaRegisterFatBinary") and audit.is_allowed_import("__cudaPushCallConfiguration")


def test_rule_reports_line_numbers():
  rejection = static_check.check_source(_src('\n\n  system("ls");'))
  assert rejection.reason == "host_syscall" and rejection.line == 5
  assert "line 5" in rejection.feedback()


def test_comments_and_strings_do_not_trigger_rules():
  body = ('// system("rm -rf /"); malloc(4);\n  /* asm("trap;"); fork(); */\n'
          '  const char* s = "cudaMalloc(";\n  (void)s;')
  assert static_check.check_source(_src(body)) is None


def test_allowed_attributes_digraphs_and_literals_pass():
  head = ("__global__ void __launch_bounds__(256) k(float* __restrict__ o) {\n"
          "  __shared__ __align__(16) float s<:4:>;\n  [[maybe_unused]] int n = 1'000'000;\n  o[0] = s[0];\n}\n"
          "__device__ __forceinline__ __attribute__((always_inline, aligned(8))) float g(float a) <% return a; %>\n")
  body = "  const char* s = \"exit( /* system\";\n  char c = '\"';\n  (void)s; (void)c;"
  assert static_check.check_source(_src(body, head)) is None


def test_source_size_is_capped():
  rejection = static_check.check_source(_src("// " + "x" * (64 << 10)))
  assert rejection.reason == "source_too_large"


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


PREPROCESSED = """# 0 "solution.cu"
# 0 "<built-in>"
# 0 "<command-line>"
# 1 "/usr/include/stdc-predef.h" 1 3 4
# 0 "<command-line>" 2
# 1 "/opt/cuda/include/cuda_runtime.h" 1
int from_header = exit;
# 0 "<command-line>" 2
# 1 "solution.cu"
# 1 "/usr/include/c++/12/cmath" 1 3
int also_from_header;
# 2 "solution.cu" 2
__attribute__((global)) void k() {}
#pragma unroll 4
%s
# 1 "kernels_eval_harness"
extern "C" void kernels_eval_call() {}
"""


def test_candidate_code_follows_the_line_markers():
  code = static_check.candidate_code(PREPROCESSED % "int x;")
  assert [line for line, _ in code.lines] == [2, 3, 4, 1, 2]
  assert "from_header" not in code.text and "kernels_eval_call" in code.text
  assert code.includes == [(1, "/usr/include/c++/12/cmath")] and code.problem is None
  assert static_check.check_preprocessed(PREPROCESSED % "int x;", "/opt/cuda") is None


@pytest.mark.parametrize("line,reason", [
    ("(exit)(0);", "host_syscall"),
    ("[[gnu::constructor]] void f();", "forbidden_attribute"),
    ("__attribute__((managed)) int m;", "forbidden_attribute"),
    ('#pragma GCC optimize("O0")', "forbidden_preprocessor"),
    ("#ident \"x\"", "forbidden_preprocessor"),
    ('# 9 "/usr/include/math.h"\nint hidden;', "forbidden_preprocessor"),
    ('# 9 "<command-line>"', "forbidden_preprocessor"),
    ('# 9 "/usr/include/math.h" 2', "forbidden_preprocessor"),
    ('# 1 "/etc/shadow" 1\nroot\n# 5 "solution.cu" 2', "forbidden_include"),
    ('# 1 "/tmp/cmath" 1\n# 5 "solution.cu" 2', "forbidden_include"),
    ('# 1 "cmath" 1\n# 5 "solution.cu" 2', "forbidden_include"),
    ("int big = " + "1 + " * (1 << 18) + "1;", "preprocess_too_large"),
])
def test_preprocessed_rules_reject(line, reason):
  rejection = static_check.check_preprocessed(PREPROCESSED % line, "/opt/cuda")
  assert rejection is not None and rejection.reason == reason, rejection
  assert "root" not in rejection.message


def test_preprocessed_rejections_name_the_candidate_line_and_gnu_markers_are_refused():
  rejection = static_check.check_preprocessed(PREPROCESSED % "int ok;\n\n  system(0);", "/opt/cuda")
  assert rejection.reason == "host_syscall" and rejection.line == 6
  log = 'solution.cu:3:3: warning: style of line directive is a GCC extension\n'
  assert static_check.check_preprocessed(PREPROCESSED % "", "/opt/cuda", log).reason == "forbidden_preprocessor"
