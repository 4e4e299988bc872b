"""Static checks on candidate CUDA C++ source, before anything is compiled.

The candidate may define kernels, device/host helper functions and the `extern "C" solution` launch
function, nothing else of consequence: the harness owns memory, streams, synchronisation and timing.
These checks give early, readable feedback; the symbol audit of the compiled library (`audit.py`) is
the check that cannot be talked around, since it sees what the code really imports.

Each rule maps a pattern to a `rejected_reason` code (see `RULES`). Comments are removed and line
continuations spliced first, so `sys\\<newline>tem(...)` is still `system(...)`.
"""
from __future__ import annotations

import re

from kernels_eval.static_check import Rejection

ALLOWED_INCLUDES = frozenset({
    "cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h", "math.h", "cmath", "stdint.h", "cfloat", "float.h",
})

_W = r"\b"
# (reason code, regex, what the feedback says). The first matching rule wins.
RULES: tuple[tuple[str, str, str], ...] = (
    ("inline_asm", _W + r"(asm|__asm__|__asm|_asm)\b", "inline assembly is not allowed"),
    ("forbidden_preprocessor", r"##|\b_Pragma\b|^\s*#\s*(line|include_next|import|pragma\s+(?!unroll\b))",
     "token pasting, _Pragma, #line and #pragma other than `#pragma unroll` are not allowed"),
    ("forbidden_attribute", r"__attribute__\s*\(\(\s*(weakref|alias|ifunc|constructor|destructor|section|"
     r"visibility|symver)\b|__declspec",
     "symbol-level attributes (weakref, alias, constructor, section, ...) are not allowed"),
    ("library_call", _W + r"(thrust|cub|cutlass|cute|torch|at|c10)\s*::|"
     r"\b(cublas|cudnn|cufft|curand|cusparse|cusolver|nccl)\w*",
     "library calls (cuBLAS, cuDNN, thrust, cub, ...) are not allowed: write the kernel"),
    ("memory_allocation", _W + r"(malloc|calloc|realloc|free|alloca|mmap|sbrk|posix_memalign|aligned_alloc|"
     r"cudaMalloc\w*|cudaFree\w*|cudaHostAlloc|cudaMallocHost|cudaMallocManaged|cudaMallocAsync|"
     r"cudaHostRegister)\s*\(|\b(new|delete)\b",
     "the harness allocates all memory: no malloc/new/cudaMalloc in the candidate"),
    ("extra_stream", _W + r"(cudaStream(?!_t\b)\w*|cudaLaunchHostFunc|cudaGraph\w*|cudaLaunchCooperative\w*|"
     r"cudaStreamPerThread|cudaStreamLegacy)\b",
     "use only the stream passed to solution(): no stream creation, capture or host callbacks"),
    ("host_thread", _W + r"(pthread\w*|fork|vfork|clone|thrd_create|std\s*::\s*(thread|jthread|async))\b",
     "host threads and processes are not allowed"),
    ("timer_tampering", _W + r"(cudaEvent\w*|cudaDeviceReset|cudaSetDevice\w*|cudaDeviceSetLimit|cudaProfiler\w*|"
     r"cudaCtx\w*|cu[A-Z]\w*|clock_gettime|gettimeofday|cudaDeviceSynchronize|cudaStreamSynchronize)\b",
     "events, device resets/synchronisation and driver-API calls are not allowed: the harness times and syncs"),
    ("host_syscall", _W + r"(system|popen|exec[lv]\w*|fopen|freopen|open|openat|creat|socket|connect|bind|"
     r"listen|accept|send\w*|recv\w*|unlink\w*|remove|rename\w*|kill|raise|exit|_exit|_Exit|abort|getenv|"
     r"setenv|putenv|dlopen|dlsym|syscall|ioctl|signal|sigaction|sleep|usleep|nanosleep|chdir|mkdir|rmdir|"
     r"fwrite|fputs|fprintf|printf|puts|write|read|ptrace|prctl|setrlimit|mprotect)\s*\(|"
     r"\bstd\s*::\s*(cout|cerr|ofstream|ifstream|fstream|filesystem|system)\b",
     "host system calls, file/network I/O and printing are not allowed"),
    ("forbidden_api", _W + r"(cudaMemcpy\w*|cudaMemset(?!Async\b)\w*|cudaIpc\w*|cudaDeviceEnablePeerAccess|"
     r"cudaHost\w*|cudaGetSymbol\w*|cudaFuncGetAddress|cudaLaunchKernel)\b",
     "host<->device copies and runtime calls other than kernel launches and cudaMemsetAsync are not allowed"),
)
_COMPILED = tuple((code, re.compile(rx, re.MULTILINE), msg) for code, rx, msg in RULES)
_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)
_ENTRY = re.compile(r'extern\s+"C"\s+(__host__\s+)?void\s+solution\s*\(')
_STRING = re.compile(r'"(\\.|[^"\\\n])*"|\'(\\.|[^\'\\\n])*\'')


def strip_comments(source: str) -> str:
  """Splices `\\`-newline continuations and blanks comments, keeping one line per source line."""
  spliced = source.replace("\\\n", "")
  out, i, n = [], 0, len(spliced)
  while i < n:
    if spliced.startswith("//", i):
      j = spliced.find("\n", i)
      i = n if j < 0 else j
    elif spliced.startswith("/*", i):
      j = spliced.find("*/", i + 2)
      j = n if j < 0 else j + 2
      out.append("\n" * spliced.count("\n", i, j) + " ")
      i = j
    elif spliced[i] in "\"'":
      match = _STRING.match(spliced, i)
      j = match.end() if match else i + 1
      out.append(spliced[i:j])
      i = j
    else:
      out.append(spliced[i])
      i += 1
  return "".join(out)


def _line_of(text: str, pos: int) -> int:
  return text.count("\n", 0, pos) + 1


def check_source(source: str) -> Rejection | None:
  """Returns the first rule the source breaks, or None when it passes."""
  if not source.strip():
    return Rejection("empty_source", "the CUDA source is empty")
  code = strip_comments(source)
  for match in _INCLUDE.finditer(code):
    header = match.group(2).strip()
    if header not in ALLOWED_INCLUDES:
      return Rejection("forbidden_include", f"#include {header} is not allowed; allowed: "
                       f"{', '.join(sorted(ALLOWED_INCLUDES))}", _line_of(code, match.start()))
  if not _ENTRY.search(code):
    return Rejection("missing_entry_point", 'no `extern "C" void solution(...)` launch function found')
  no_strings = _STRING.sub('""', code)
  for reason, rx, message in _COMPILED:
    match = rx.search(no_strings)
    if match:
      return Rejection(reason, f"`{match.group(0).strip()}`: {message}", _line_of(no_strings, match.start()))
  return None
