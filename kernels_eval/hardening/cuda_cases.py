"""Adversarial CUDA candidates for the embedded task `add` (out = x + y, float32 (M, N)).

Every case is a complete candidate source; `CASES` lists them with the stage that must catch each one
(see `kernels_eval.hardening.cases`). The sources are written to pass every stage before their own, so
a case proves the stage it names.
"""
from __future__ import annotations

from kernels_eval.hardening.cases import Case

TASK_ID = "add"
_PROTO = "const float* x, const float* y, float* out, int M, int N, cudaStream_t stream"
_KERNEL = """
__global__ void add_kernel(const float* x, const float* y, float* out, int size) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < size) out[i] = x[i] + y[i];
}
"""
_LAUNCH = "  add_kernel<<<(M * N + 255) / 256, 256, 0, stream>>>(x, y, out, M * N);\n"


def _src(body: str = _LAUNCH, *, head: str = "", kernel: str = _KERNEL, includes: str = "") -> str:
  return (f"#include <cuda_runtime.h>\n{includes}{head}{kernel}\n"
          f'extern "C" void solution({_PROTO}) {{\n{body}}}\n')


def _case(name: str, attack: str, stage: str, status: str, reason: str | None, source: str,
          flag: str | None = None) -> Case:
  on_gpu = stage in ("gpu", "sanitizer")
  return Case(name=f"cuda_{name}", lang="cuda", task_id=TASK_ID, attack=attack,
              stage="correctness" if stage == "gpu" else stage, status=status, reason=reason, flag=flag,
              source=source, needs_gpu=on_gpu)


CASES: tuple[Case, ...] = (
    # Static source rules.
    _case("system_call", "system()", "static", "compile_error", "host_syscall",
          _src('  system("touch pwned");\n' + _LAUNCH, head='extern "C" int system(const char*);\n')),
    _case("system_line_splice", "system() hidden by a line continuation", "static", "compile_error",
          "host_syscall",
          _src('  sys\\\ntem("touch pwned");\n' + _LAUNCH, head='extern "C" int system(const char*);\n')),
    _case("system_token_paste", "system() assembled by token pasting", "static", "compile_error",
          "forbidden_preprocessor",
          _src('  CAT(sys, tem)("touch pwned");\n' + _LAUNCH, head="#define CAT(a, b) a##b\n")),
    _case("system_weakref", "system() through a weakref alias", "static", "compile_error", "forbidden_attribute",
          _src('  run("touch pwned");\n' + _LAUNCH,
               head='static int run(const char*) __attribute__((weakref("system")));\n')),
    _case("fork_bomb", "fork bomb", "static", "compile_error", "host_thread",
          _src("  while (fork() >= 0) {}\n" + _LAUNCH, head='extern "C" int fork(void);\n')),
    _case("pthread_create", "extra host thread", "static", "compile_error", "host_thread",
          _src("  pthread_create(0, 0, 0, 0);\n" + _LAUNCH,
               head='extern "C" int pthread_create(void*, const void*, void* (*)(void*), void*);\n')),
    _case("std_thread", "extra host thread (std::thread)", "static", "compile_error", "host_thread",
          _src("  std::thread t([] {});\n  t.join();\n" + _LAUNCH)),
    _case("stream_create", "extra stream the timer does not see", "static", "compile_error", "extra_stream",
          _src("  cudaStream_t side;\n  cudaStreamCreate(&side);\n"
               "  add_kernel<<<(M * N + 255) / 256, 256, 0, side>>>(x, y, out, M * N);\n")),
    _case("file_write", "file write outside the temp dir", "static", "compile_error", "host_syscall",
          _src('  fopen("/tmp/pwned", "w");\n' + _LAUNCH, head='extern "C" void* fopen(const char*, const char*);\n')),
    _case("network_connect", "network connect", "static", "compile_error", "host_syscall",
          _src("  int s = socket(2, 1, 0);\n  connect(s, 0, 0);\n" + _LAUNCH,
               head='extern "C" int socket(int, int, int);\nextern "C" int connect(int, const void*, unsigned);\n')),
    _case("huge_cuda_malloc", "huge device allocation", "static", "compile_error", "memory_allocation",
          _src("  float* p;\n  cudaMalloc(&p, 1ull << 40);\n" + _LAUNCH)),
    _case("huge_host_malloc", "huge host allocation", "static", "compile_error", "memory_allocation",
          _src("  volatile char* p = (char*)malloc(1ull << 40);\n  p[0] = 1;\n" + _LAUNCH,
               head='extern "C" void* malloc(unsigned long);\n')),
    _case("cublas_include", "library call instead of a kernel (cuBLAS header)", "static", "compile_error",
          "forbidden_include", _src(_LAUNCH, includes="#include <cublas_v2.h>\n")),
    _case("cublas_extern", "library call instead of a kernel (cuBLAS symbol)", "static", "compile_error",
          "library_call", _src("  void* h;\n  cublasCreate_v2(&h);\n" + _LAUNCH,
                               head='extern "C" int cublasCreate_v2(void**);\n')),
    _case("inline_asm_trap", "inline PTX", "static", "compile_error", "inline_asm",
          _src(kernel=_KERNEL.replace("if (i < size)", 'asm volatile("trap;");\n  if (i < size)'))),
    _case("event_timer", "timer tampering with events", "static", "compile_error", "timer_tampering",
          _src("  cudaEvent_t e;\n  cudaEventCreate(&e);\n  cudaEventRecord(e, stream);\n" + _LAUNCH)),
    _case("host_compute", "copy to the host and compute there", "static", "compile_error", "forbidden_api",
          _src("  static float buf[1];\n  cudaMemcpy(buf, x, 4, cudaMemcpyDeviceToHost);\n" + _LAUNCH)),
    _case("load_constructor", "code run when the library is loaded", "static", "compile_error",
          "forbidden_attribute", _src(head="__attribute__((constructor)) static void early() {}\n")),
    _case("include_file", "read a host file through #include", "static", "compile_error", "forbidden_include",
          _src(includes='#include "/etc/passwd"\n')),
    _case("missing_extern_c", "launch function without C linkage", "static", "compile_error",
          "missing_entry_point", _src().replace('extern "C" void solution', "void solution")),
    # Preprocessor, attribute and load-time tricks: the rules apply to the source as written and to
    # nvcc's preprocessed host and device passes; the audit reads the library's constructor tables.
    _case("include_macro", "read a host file through #include MACRO", "static", "compile_error",
          "forbidden_include", _src(includes='#define HOST_FILE "/etc/shadow"\n#include HOST_FILE\n')),
    _case("include_digraph", "read a host file through %:include", "static", "compile_error", "forbidden_include",
          _src(includes='%:include "/etc/shadow"\n')),
    _case("include_proc_environ", "read the parent's environment through #include", "static", "compile_error",
          "forbidden_include", _src(includes='#include "/proc/self/environ"\n')),
    _case("system_digraph_paste", "system() assembled by %:%: token pasting", "static", "compile_error",
          "forbidden_preprocessor",
          _src('  CAT(sys, tem)("touch pwned");\n' + _LAUNCH, head="#define CAT(a, b) a %:%: b\n")),
    _case("exit_parenthesised", "exit() called as (exit)(0)", "static", "compile_error", "host_syscall",
          _src("  (exit)(0);\n" + _LAUNCH, head='extern "C" void exit(int);\n')),
    _case("exit_pointer", "exit() through a function pointer (&exit)", "static", "compile_error", "host_syscall",
          _src("  void (*volatile quit)(int) = &exit;\n  quit(0);\n" + _LAUNCH, head='extern "C" void exit(int);\n')),
    _case("exit_macro", "exit() behind a macro name", "static", "compile_error", "host_syscall",
          _src("  QUIT(0);\n" + _LAUNCH, head='extern "C" void exit(int);\n#define QUIT exit\n')),
    _case("builtin_exit", "exit() through a compiler builtin", "static", "compile_error", "forbidden_builtin",
          _src("  if (M < 0) __builtin_exit(0);\n" + _LAUNCH)),
    _case("constructor_gnu_attribute", "code run when the library is loaded ([[gnu::constructor]])", "static",
          "compile_error", "forbidden_attribute",
          _src(head="[[gnu::constructor]] static void early() { cudaGetLastError(); }\n")),
    _case("constructor_attribute_list", "code run when the library is loaded (used, constructor)", "static",
          "compile_error", "forbidden_attribute",
          _src(head="__attribute__((used, constructor)) static void early() { cudaGetLastError(); }\n")),
    _case("constructor_dunder", "code run when the library is loaded (__constructor__)", "static",
          "compile_error", "forbidden_attribute",
          _src(head="__attribute__((__constructor__)) static void early() { cudaGetLastError(); }\n")),
    _case("init_array_section", "code run when the library is loaded (pointer in .init_array)", "static",
          "compile_error", "forbidden_attribute",
          _src(head='static void early() { cudaGetLastError(); }\n'
               '__attribute__((section(".init_array"))) static void (*run_early)() = early;\n')),
    _case("managed_result_cache", "result caching across calls (__managed__ variable)", "static",
          "compile_error", "forbidden_attribute",
          _src("  if (last[0] == x) return;\n  last[0] = x;\n" + _LAUNCH,
               head="__managed__ const float* last[1];\n")),
    _case("line_relabel", "code relabelled as a system header (#line)", "static", "compile_error",
          "forbidden_preprocessor", _src(head='#line 1 "/usr/include/math.h"\n')),
    _case("line_relabel_digraph", "code relabelled as a system header (%:line)", "static", "compile_error",
          "forbidden_preprocessor", _src(head='%:line 1 "/usr/include/math.h"\n')),
    _case("line_marker", "code attributed to a system header (GNU line marker)", "static", "compile_error",
          "forbidden_preprocessor",
          _src(head='# 1 "/usr/include/math.h" 1 3 4\nstatic int hidden;\n# 4 "solution.cu" 2\n')),
    _case("raw_string_lexer", "raw string literal hiding a directive from the source rules", "static",
          "compile_error", "forbidden_preprocessor",
          _src(head='static const char* s = R"x(" /* )x";\n# 1 "/usr/include/math.h" 1 3 4\n// */\n')),
    _case("pragma_macro", "_Pragma through a macro (optimisation and diagnostics control)", "static",
          "compile_error", "forbidden_preprocessor",
          _src(head='#define NO_OPT _Pragma("GCC optimize(\\"O0\\")")\nNO_OPT\n')),
    _case("arch_host_path", "host-only code behind #ifndef __CUDA_ARCH__", "static", "compile_error",
          "host_syscall",
          _src('  HOST_ONLY((system)("touch pwned"));\n' + _LAUNCH,
               head='#ifndef __CUDA_ARCH__\nextern "C" int system(const char*);\n#define HOST_ONLY(x) x\n'
               "#else\n#define HOST_ONLY(x)\n#endif\n")),
    _case("arch_device_asm", "inline PTX only in the device pass (#ifdef __CUDA_ARCH__)", "static",
          "compile_error", "inline_asm",
          _src(kernel=_KERNEL.replace("if (i < size)", '#ifdef __CUDA_ARCH__\n  asm volatile("trap;");\n#endif\n'
                                      "  if (i < size)"))),
    _case("preprocessor_bomb", "exponential macro expansion", "static", "compile_error", "preprocess_too_large",
          _src(head="#define A0 1,\n" + "".join(f"#define A{k} A{k - 1} A{k - 1}\n" for k in range(1, 41))
               + "static const int bomb[] = {A40 0};\n")),
    _case("constant_in_if0", "host static hidden behind a fake __constant__ in #if 0", "audit", "compile_error",
          "mutable_global_state",
          _src("  if (last[0] == x) return;\n  last[0] = x;\n" + _LAUNCH,
               head="#if 0\n__constant__ const float* last[1];\n#endif\nstatic const float* last[1];\n")),
    _case("global_object_constructor", "code run when the library is loaded (C++ global object)", "audit",
          "compile_error", "load_time_code",
          _src(head="struct Warmup {\n  Warmup() { for (volatile int i = 0; i < (1 << 20); ++i) {} }\n};\n"
               "static Warmup warmup;\n")),
    # Compilation.
    _case("wrong_prototype", "launch function with another signature", "compile", "compile_error", None,
          _src().replace("const float* x, const float* y", "float* x, float* y")),
    # Symbol audit: names the source rules do not list; the import allow-list still refuses them.
    _case("posix_spawn", "process spawn", "audit", "compile_error", "forbidden_import",
          _src('  posix_spawnp(0, "sh", 0, 0, 0, 0);\n' + _LAUNCH,
               head='extern "C" int posix_spawnp(int*, const char*, const void*, const void*, char* const*, '
               "char* const*);\n")),
    _case("creat64", "file write outside the temp dir", "audit", "compile_error", "forbidden_import",
          _src('  creat64("/tmp/pwned", 0644);\n' + _LAUNCH, head='extern "C" int creat64(const char*, unsigned);\n')),
    _case("getaddrinfo", "network lookup", "audit", "compile_error", "forbidden_import",
          _src('  getaddrinfo("example.com", 0, 0, 0);\n' + _LAUNCH,
               head='extern "C" int getaddrinfo(const char*, const char*, const void*, void**);\n')),
    _case("host_result_cache", "result caching across calls (host static)", "audit", "compile_error",
          "mutable_global_state",
          _src("  static const float* last = nullptr;\n  if (last == x) return;\n  last = x;\n" + _LAUNCH)),
    _case("device_result_cache", "result caching across calls (__device__ buffer)", "audit", "compile_error",
          "mutable_global_state",
          _src(kernel=_KERNEL.replace("__global__", "__device__ float g_cache[1 << 20];\n__global__").replace(
              "out[i] = x[i] + y[i];", "out[i] = (g_cache[i & 0xFFFFF] = x[i] + y[i]);"))),
    # GPU run.
    _case("infinite_loop_kernel", "infinite loop on the device", "gpu", "timeout", None,
          _src(kernel=_KERNEL.replace("if (i < size)", "for (volatile int spin = 1; spin;) {}\n  if (i < size)"))),
    _case("infinite_loop_host", "infinite loop in host code", "gpu", "timeout", None,
          _src("  for (volatile int spin = 0; spin >= 0; spin = 1) {}\n" + _LAUNCH)),
    _case("host_segfault", "segfault in host code", "gpu", "runtime_error", None,
          _src("  *(volatile int*)nullptr = 1;\n" + _LAUNCH)),
    _case("stack_allocation", "huge allocation on the host stack", "gpu", "runtime_error", None,
          _src("  volatile char big[1 << 30];\n  big[0] = 1;\n  big[(1 << 30) - 1] = big[0];\n" + _LAUNCH)),
    _case("illegal_address", "illegal address on the device", "gpu", "runtime_error", None,
          _src(kernel=_KERNEL.replace("out[i] = x[i] + y[i];", "out[i + (1 << 30)] = x[i] + y[i];"))),
    _case("zeros_output", "zeros output", "gpu", "wrong_output", None,
          _src(kernel=_KERNEL.replace("x[i] + y[i]", "0.0f"))),
    _case("stale_output", "output buffer never written", "gpu", "wrong_output", None,
          _src(kernel=_KERNEL.replace("if (i < size) out[i] = x[i] + y[i];", "if (i < 0) out[i] = x[i];"))),
    _case("input_overwrite", "input overwrite", "gpu", "wrong_output", "input_mutation",
          _src(kernel=_KERNEL.replace("out[i] = x[i] + y[i];",
                                      "{ float s = x[i] + y[i]; out[i] = s; ((float*)y)[i] = 0.0f; }"))),
    _case("decoy_kernel", "decoy kernel (defined, never launched)", "gpu", "wrong_output", "no_kernel_launched",
          _src("  cudaMemsetAsync(out, 0, sizeof(float) * M * N, stream);\n")),
    _case("default_stream", "work on another stream (the legacy default stream)", "gpu", "wrong_output",
          "extra_stream", _src("  add_kernel<<<(M * N + 255) / 256, 256>>>(x, y, out, M * N);\n")),
    _case("oob_write", "out-of-bounds write one past the end", "sanitizer", "runtime_error", "memory_error",
          _src(kernel=_KERNEL.replace("if (i < size) out[i] = x[i] + y[i];",
                                      "if (i < size) out[i] = x[i] + y[i];\n  if (i == size) out[i] = 0.0f;"))),
)
