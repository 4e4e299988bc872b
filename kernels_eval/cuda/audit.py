"""Symbol audit of a compiled candidate library.

The library links the CUDA runtime dynamically (`-cudart none -l:libcudart.so.13`), so every runtime,
libc or libstdc++ function it can reach shows up as an undefined dynamic symbol. Anything outside
`ALLOWED_IMPORTS` (kernel registration and launch, error queries, `cudaMemsetAsync`, C++ runtime glue
and libm) rejects the candidate, however the call was spelled in the source. Writable module-level
data (host `static` variables, `__device__` globals) rejects it too: results must not persist across
calls. `__constant__` arrays are allowed, since nothing that could write them is importable.
"""
from __future__ import annotations

import re
import subprocess

from kernels_eval.cuda.static_check import Rejection, strip_comments

ALLOWED_IMPORTS = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaGetLastError", "cudaPeekAtLastError",
    "cudaGetErrorString", "cudaGetErrorName", "cudaFuncSetAttribute", "cudaFuncGetAttributes",
    "cudaGetDevice", "cudaDeviceGetAttribute", "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
    "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", "cudaOccupancyAvailableDynamicSMemPerBlock",
    "cudaMemsetAsync",
    "__cxa_atexit", "__cxa_finalize", "__cxa_guard_acquire", "__cxa_guard_release", "__cxa_guard_abort",
    "__cxa_begin_catch", "__cxa_end_catch", "__gxx_personality_v0", "_Unwind_Resume", "__gmon_start__",
    "_ITM_deregisterTMCloneTable", "_ITM_registerTMCloneTable", "__stack_chk_fail", "_ZSt9terminatev",
    "memset", "memcpy", "memmove",
    # nvcc's host-side bodies of __device__ functions call exit(); the source rules forbid calling it.
    "exit",
})
# Kernel registration emitted by nvcc (`__cudaRegisterFatBinary`, `__cudaPushCallConfiguration`, ...).
_ALLOWED_IMPORT_RX = re.compile(
    r"__cuda\w+|"
    r"(a?(sin|cos|tan)h?|atan2|exp2?|exp10|expm1|log(2|10|1p|b)?|pow|sqrt|rsqrt|cbrt|ceil|floor|round|l?lround|"
    r"trunc|fmod|remainder|fabs|fmax|fmin|fma|fdim|hypot|erfc?|tgamma|lgamma|ldexp|frexp|scalbn|nearbyint|"
    r"l?l?rint|copysign|modf|ilogb)f?")
# Writable data the toolchain itself emits (registration handles, CRT bookkeeping).
_TOOLCHAIN_DATA_RX = re.compile(
    r".*(__device_stub__|__nv_|__cuda|__fatDeviceText|fatbinData|__module_id_str).*|"
    r"completed\.\d+|__TMC_END__|__dso_handle|_DYNAMIC|_GLOBAL_OFFSET_TABLE_|DW\.ref\..*|"
    r"__frame_dummy_init_array_entry|__do_global_dtors_aux_fini_array_entry|__bss_start|_edata|_end")
_CONSTANT_DECL = re.compile(r"__constant__\s+[^;=\[(]*?\b(\w+)\s*[\[=;]")
REQUIRED_EXPORTS = ("solution",)


def _nm(path: str, *args: str) -> list[str]:
  out = subprocess.run(["nm", *args, path], capture_output=True, text=True, timeout=60, check=False)
  if out.returncode != 0:
    raise RuntimeError(f"nm {' '.join(args)} {path} failed: {out.stderr.strip()}")
  return out.stdout.splitlines()


def dynamic_symbols(path: str) -> tuple[list[str], set[str]]:
  """(imported, exported) dynamic symbol names of the library, version suffixes dropped."""
  imported, exported = [], set()
  for line in _nm(path, "-D"):
    parts = line.split()
    if len(parts) >= 2 and parts[-2] in "Uw":
      imported.append(parts[-1].split("@")[0])
    elif len(parts) == 3:
      exported.add(parts[-1].split("@")[0])
  return imported, exported


def undefined_imports(path: str) -> list[str]:
  return dynamic_symbols(path)[0]


def is_allowed_import(name: str) -> bool:
  return name in ALLOWED_IMPORTS or bool(_ALLOWED_IMPORT_RX.fullmatch(name))


def _demangled_base(name: str) -> str:
  """`_ZL7g_cache` -> `g_cache`: the identifier of an internal-linkage variable."""
  match = re.fullmatch(r"_ZL(\d+)(\w+)", name)
  if match:
    return match.group(2)[: int(match.group(1))]
  return name


def audit_library(path: str, source: str = "", exports: tuple[str, ...] = REQUIRED_EXPORTS) -> Rejection | None:
  """Checks the imports, writable globals and exports of a compiled candidate library.

  Args:
    path: the shared library.
    source: the candidate source, to recognise its `__constant__` arrays.
    exports: symbols the library must define (the launch function and the harness entry).
  Returns:
    A Rejection (`forbidden_import`, `mutable_global_state`, `missing_entry_point`), or None.
  """
  imported, exported = dynamic_symbols(path)
  bad = sorted({n for n in imported if not is_allowed_import(n)})
  if bad:
    return Rejection("forbidden_import", "the compiled library imports functions the candidate may not call: "
                     + ", ".join(bad[:12]))
  constants = set(_CONSTANT_DECL.findall(strip_comments(source)))
  mutable = []
  for line in _nm(path):
    parts = line.split()
    if len(parts) == 3 and parts[1] in "bBdD" and not _TOOLCHAIN_DATA_RX.fullmatch(parts[2]):
      if _demangled_base(parts[2]) not in constants:
        mutable.append(parts[2])
  if mutable:
    return Rejection("mutable_global_state", "module-level or static variables keep state across calls "
                     f"(results must not be cached): {', '.join(sorted(mutable)[:8])}")
  missing = [e for e in exports if e not in exported]
  if missing:
    return Rejection("missing_entry_point", f"the library does not export {missing} with C linkage "
                     '(declare `extern "C" void solution(...)`)')
  return None
