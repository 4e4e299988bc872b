"""Symbol audit of a compiled candidate library.

The library links the CUDA runtime dynamically (`-cudart none -l:libcudart.so.13`), so every runtime,
libc or libstdc++ function it can reach shows up as an undefined dynamic symbol. Anything outside
`ALLOWED_IMPORTS` (kernel registration and launch, error queries, `cudaMemsetAsync`, C++ runtime glue
and libm) rejects the candidate, however the call was spelled in the source (`forbidden_import`). The
launch entry points allowed are exactly those the harness interposes and counts (`OBSERVED_LAUNCHES`,
see `runner.cu`); any other way to start work on the GPU (cooperative launches, graphs, host functions,
`__cudaGetProcAddress`, the driver API) is refused, so a launch is never run unseen.

Nothing of the candidate may run when the library is loaded or unloaded (`load_time_code`): every entry
of `.init_array`, `.fini_array`, `.preinit_array`, `.ctors` and `.dtors` must resolve (through its
relocation and the symbol table) to a function the toolchain itself puts there for every library:
`frame_dummy` and `__do_global_dtors_aux` (GCC's crtbegin) and nvcc's kernel registration
`__sti____cudaRegisterAll`; DT_INIT/DT_FINI must be `_init`/`_fini`; no IFUNC resolver. A candidate
constructor, destructor or C++ global object with a dynamic initialiser (`_GLOBAL__sub_I_*`) is
refused there.

Writable module-level data (host `static` variables, `__device__` globals) rejects it too
(`mutable_global_state`): results must not persist across calls. The host shadows of `__constant__`
arrays are allowed; they are recognised from the candidate's code (`constant_names`), preferably the
preprocessed text, so that a declaration in `#if 0` or in another namespace cannot vouch for a host
variable of the same name.
"""
from __future__ import annotations

import re
import subprocess

from kernels_eval.cuda import static_check as static_check_lib
from kernels_eval.static_check import Rejection

# The launch entry points `runner.cu` interposes: `<<<>>>`, cudaLaunchKernel, cudaLaunchKernelEx(C), and the
# `_ptsz` symbols the same code imports under CUDA_API_PER_THREAD_DEFAULT_STREAM.
OBSERVED_LAUNCHES = frozenset({
    "__cudaLaunchKernel", "__cudaLaunchKernel_ptsz", "cudaLaunchKernel", "cudaLaunchKernel_ptsz",
    "cudaLaunchKernelExC", "cudaLaunchKernelExC_ptsz",
})
ALLOWED_IMPORTS = OBSERVED_LAUNCHES | frozenset({
    "cudaGetLastError", "cudaPeekAtLastError",
    "cudaGetErrorString", "cudaGetErrorName", "cudaFuncSetAttribute", "cudaFuncGetAttributes",
    "cudaGetDevice", "cudaDeviceGetAttribute", "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
    "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", "cudaOccupancyAvailableDynamicSMemPerBlock",
    "cudaMemsetAsync",
    "__cxa_atexit", "__cxa_finalize", "__cxa_guard_acquire", "__cxa_guard_release", "__cxa_guard_abort",
    "__cxa_begin_catch", "__cxa_end_catch", "__gxx_personality_v0", "_Unwind_Resume", "__gmon_start__",
    "_ITM_deregisterTMCloneTable", "_ITM_registerTMCloneTable", "__stack_chk_fail", "_ZSt9terminatev",
    "memset", "memcpy", "memmove",
    # nvcc's host-side bodies of __device__ functions call exit(); the source rules forbid naming it.
    "exit",
})
# Kernel registration emitted by nvcc (`__cudaRegisterFatBinary`, `__cudaPushCallConfiguration`, ...); not
# a launch (those are OBSERVED_LAUNCHES) nor a function-pointer lookup.
_ALLOWED_IMPORT_RX = re.compile(
    r"__cuda(?!Launch|GetProcAddress)\w+|"
    r"(a?(sin|cos|tan)h?|atan2|exp2?|exp10|expm1|log(2|10|1p|b)?|pow|sqrt|rsqrt|cbrt|ceil|floor|round|l?lround|"
    r"trunc|fmod|remainder|fabs|fmax|fmin|fma|fdim|hypot|erfc?|tgamma|lgamma|ldexp|frexp|scalbn|nearbyint|"
    r"l?l?rint|copysign|modf|ilogb)f?")
# Writable data the toolchain itself emits (registration handles, CRT bookkeeping).
_TOOLCHAIN_DATA_RX = re.compile(
    r".*(__device_stub__|__nv_|__cuda|__fatDeviceText|fatbinData|__module_id_str).*|"
    r"completed\.\d+|__TMC_END__|__dso_handle|_DYNAMIC|_GLOBAL_OFFSET_TABLE_|DW\.ref\..*|"
    r"__frame_dummy_init_array_entry|__do_global_dtors_aux_fini_array_entry|__bss_start|_edata|_end")
# What the toolchain itself puts in the constructor/destructor tables of every library.
_TOOLCHAIN_LOAD_TIME_RX = re.compile(r"frame_dummy|__do_global_dtors_aux|(_ZL\d+)?__sti____cudaRegisterAllv?")
LOAD_TIME_TABLES = (".init_array", ".fini_array", ".preinit_array", ".ctors", ".dtors")
# A `__constant__` declaration at namespace scope (raw spelling, or as nvcc -E expands it).
_CONSTANT_DECL = re.compile(r"(?:^|(?<=[;{}]))\s*(?:static\s+)?(?:__constant__|__attribute__\s*\(\(\s*constant\s*\)\))"
                            r"\s+[^;=\[(){}]*?\b(\w+)\s*[\[=;{]", re.MULTILINE)
_CONDITIONAL = re.compile(r"^\s*#\s*(if|ifdef|ifndef|endif)\b", re.MULTILINE)
REQUIRED_EXPORTS = ("solution",)


def _tool(*argv: str) -> str:
  out = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)
  if out.returncode != 0:
    raise RuntimeError(f"{' '.join(argv)} failed: {out.stderr.strip()}")
  return out.stdout


def _nm(path: str, *args: str) -> list[str]:
  return _tool("nm", *args, path).splitlines()


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


def _depth(code: str, conditionals: bool) -> int:
  """Brace plus parenthesis depth at the end of `code`, plus (with `conditionals`) #if nesting."""
  depth = code.count("{") - code.count("}") + code.count("(") - code.count(")")
  if conditionals:
    opened = [m.group(1) for m in _CONDITIONAL.finditer(code)]
    depth += len(opened) - 2 * opened.count("endif")
  return depth


def constant_names(text: str) -> set[str]:
  """Names of the `__constant__` variables the candidate declares at namespace scope.

  `text` is nvcc's preprocessed output (the candidate's lines are taken from its line markers) or,
  failing that, the source as written, where only declarations outside every `#if` block count.
  Either way a name may be missed, never invented: a missed one only makes the audit stricter.
  """
  preprocessed = text.startswith("# 0 ")
  code = static_check_lib.candidate_code(text).text if preprocessed else static_check_lib.normalise(text)
  code = static_check_lib.strip_literals(code)
  names, depth, done = set(), 0, 0
  for m in _CONSTANT_DECL.finditer(code):
    depth += _depth(code[done:m.start(1)], not preprocessed)
    done = m.start(1)
    if depth == 0:
      names.add(m.group(1))
  return names


def _symbol_addresses(path: str) -> dict[int, set[str]]:
  """Address -> names of the defined symbols of the full symbol table."""
  table: dict[int, set[str]] = {}
  for line in _nm(path):
    parts = line.split()
    if len(parts) == 3:
      table.setdefault(int(parts[0], 16), set()).add(parts[2])
  return table


def _relocations(path: str) -> tuple[dict[int, tuple[str, str]], list[str]]:
  """({offset: (type, target)}, IRELATIVE offsets); target is a hex address or a symbol name."""
  found, ifuncs = {}, []
  for line in _tool("readelf", "-r", "-W", path).splitlines():
    parts = line.split()
    if len(parts) < 4 or not parts[2].startswith("R_") or not re.fullmatch(r"[0-9a-f]+", parts[0]):
      continue
    offset, kind = int(parts[0], 16), parts[2]
    if "IRELATIVE" in kind:
      ifuncs.append(parts[0])
    symbolic = len(parts) == 7 and parts[5] == "+" and parts[6] == "0"
    target = parts[3] if kind.endswith("RELATIVE") else (parts[4].split("@")[0] if symbolic else "?")
    found[offset] = (kind, target)
  return found, ifuncs


def _tables(path: str) -> list[tuple[str, int, int]]:
  """(name, address, size) of the library's constructor/destructor tables."""
  tables = []
  for line in _tool("readelf", "-S", "-W", path).splitlines():
    m = re.search(r"\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)", line)
    if m and m.group(1) in LOAD_TIME_TABLES:
      tables.append((m.group(1), int(m.group(2), 16), int(m.group(3), 16)))
  return tables


def _entry_names(relocation: tuple[str, str] | None, symbols: dict[int, set[str]]) -> set[str]:
  if relocation is None:
    return set()
  kind, target = relocation
  if kind.endswith("RELATIVE"):
    return symbols.get(int(target, 16), set())
  return {target}


def load_time_code(path: str) -> list[str]:
  """What in the library would run at load or unload time besides the toolchain's own functions:
  `table: name` per offending entry (`?` where an entry cannot be resolved)."""
  symbols = _symbol_addresses(path)
  relocations, ifuncs = _relocations(path)
  found = [f"IFUNC resolver at 0x{offset}" for offset in ifuncs]
  for name, address, size in _tables(path):
    for slot in range(address, address + size, 8):
      names = _entry_names(relocations.get(slot), symbols)
      if not names or not all(_TOOLCHAIN_LOAD_TIME_RX.fullmatch(n) for n in names):
        found.append(f"{name}: {', '.join(sorted(names)) or '?'}")
  dynamic = _tool("readelf", "-d", "-W", path)
  for tag, expected in (("INIT", "_init"), ("FINI", "_fini")):
    m = re.search(rf"\({tag}\)\s+0x([0-9a-f]+)", dynamic)
    if m and expected not in symbols.get(int(m.group(1), 16), set()):
      found.append(f"DT_{tag}: {', '.join(sorted(symbols.get(int(m.group(1), 16), ()))) or '?'}")
  return found


def audit_library(path: str, source: str = "", exports: tuple[str, ...] = REQUIRED_EXPORTS) -> Rejection | None:
  """Checks the imports, load-time code, writable globals and exports of a compiled candidate library.

  Args:
    path: the shared library.
    source: the candidate's preprocessed host text (`compile.preprocess`), or its source as written, to
      recognise its `__constant__` arrays (`constant_names`).
    exports: symbols the library must define (the launch function and the harness entry).
  Returns:
    A Rejection (`forbidden_import`, `load_time_code`, `mutable_global_state`, `missing_entry_point`), or
    None.
  """
  imported, exported = dynamic_symbols(path)
  bad = sorted({n for n in imported if not is_allowed_import(n)})
  if bad:
    return Rejection("forbidden_import", "the compiled library imports functions the candidate may not call: "
                     + ", ".join(bad[:12]))
  early = load_time_code(path)
  if early:
    return Rejection("load_time_code", "code would run when the library is loaded or unloaded (constructors, "
                     f"destructors, global objects with dynamic initialisation): {'; '.join(early[:6])}")
  shadows = {f"_ZL{len(name)}{name}" for name in constant_names(source)}
  mutable = []
  for line in _nm(path):
    parts = line.split()
    if len(parts) == 3 and parts[1] in "bBdD" and not _TOOLCHAIN_DATA_RX.fullmatch(parts[2]):
      if parts[2] not in shadows:
        mutable.append(parts[2])
  if mutable:
    return Rejection("mutable_global_state", "module-level or static variables keep state across calls "
                     f"(results must not be cached): {', '.join(sorted(mutable)[:8])}")
  missing = [e for e in exports if e not in exported]
  if missing:
    return Rejection("missing_entry_point", f"the library does not export {missing} with C linkage "
                     '(declare `extern "C" void solution(...)`)')
  return None
