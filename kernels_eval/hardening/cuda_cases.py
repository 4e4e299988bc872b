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
