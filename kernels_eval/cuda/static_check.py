"""Static checks on candidate CUDA C++ source: on the text as written, then on what the compiler sees.

The candidate may define kernels, device/host helper functions and the `extern "C" solution` launch
function, nothing else of consequence: the harness owns memory, streams, synchronisation and timing.
The symbol audit of the compiled library (`audit.py`) is the check that cannot be talked around, since
it sees what the code really imports and runs at load time; these checks come first.

1. `check_source(source)`: the source as written, for early readable feedback. Lines are spliced
   (`\\`, optional blanks, newline), comments removed and digraphs normalised (`%:` is `#`, `%:%:` is
   `##`, `<:` is `[`, ...). Refused here: sources over `MAX_SOURCE_BYTES`; raw string literals; a
   directive outside `ALLOWED_DIRECTIVES` (so no `#line`, GNU line markers `# 12 "file"`,
   `#include_next`, `#pragma` other than `unroll`); an `#include` not written `<name>` or `"name"`
   with a name in `ALLOWED_INCLUDES`; `#define`/`#undef` of a reserved name (`__x`, `_X`); `##`,
   `_Pragma`, `__has_include`; a missing `extern "C" solution`; then `RULES` and the attribute rule.
2. `check_preprocessed(text, toolkit_root, log)`: one of nvcc's preprocessed outputs (the host pass or
   the device pass, see `compile.preprocess`). The candidate's code is found from the line markers
   (`# N "file" flags`): the lines of `solution.cu` and of the harness shim, with macros expanded,
   digraphs resolved and every `#if` decided. Refused: a file included directly by the candidate whose
   name is not in `ALLOWED_INCLUDES` or which lies outside the toolkit and the system include folders;
   a line marker that renames the current file (`#line`) instead of entering or leaving an include;
   a GNU line marker written in the source (GCC itself reports those under `-Wpedantic`: `log`); a
   `#pragma` other than `unroll`; expanded candidate code over `MAX_EXPANDED_BYTES`; then the same
   `RULES` and attribute rule as in step 1.

`RULES` map a pattern to a `rejected_reason`; the first rule of the table that matches wins. Forbidden
identifiers are refused wherever they occur, not only where called: `(exit)(0)`, `&exit` and
`auto f = exit;` name `exit` too. Every `__attribute__((...))` and `[[...]]` must name only
`ALLOWED_ATTRIBUTES` (what CUDA's qualifiers expand to, and inert hints): no constructor, destructor,
section, alias, weakref, ifunc, visibility, used, cleanup, ... (`forbidden_attribute`).

Kernels are launched with `<<<...>>>` or `cudaLaunchKernelEx`/`cudaLaunchKernelExC`, which the harness
observes (`runner.cu` interposes their runtime symbols); every other `cudaLaunch*` and the driver entry-point
lookups are refused here, and the audit refuses any launch symbol the harness does not interpose.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Sequence

from kernels_eval.cuda.prototype import SHIM_FILENAME
from kernels_eval.static_check import MAX_SOURCE_BYTES, Rejection

ALLOWED_INCLUDES = frozenset({
    "cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h", "math.h", "cmath", "stdint.h", "cfloat", "float.h",
})
ALLOWED_DIRECTIVES = frozenset({"include", "define", "undef", "if", "ifdef", "ifndef", "elif", "else", "endif",
                                "error", "warning", "pragma", ""})
SOURCE_NAME = "solution.cu"  # the name nvcc compiles the candidate under
SYSTEM_INCLUDE_ROOTS = ("/usr/include", "/usr/lib/gcc")
MAX_EXPANDED_BYTES = 1 << 20  # the candidate's own code after macro expansion, per preprocessing pass
MAX_ATTRIBUTE_CHARS = 512  # one attribute group
ALLOWED_ATTRIBUTES = frozenset({
    # what CUDA's qualifiers expand to (crt/host_defines.h)
    "global", "device", "host", "shared", "constant", "grid_constant", "launch_bounds", "cluster_dims",
    "block_size", "maxnreg", "local_maxnreg", "always_inline", "noinline", "nv_inline_hint", "aligned",
    "noreturn", "nv_pure",
    # inert hints
    "unused", "maybe_unused", "nodiscard", "fallthrough", "likely", "unlikely", "deprecated", "const", "pure",
    "hot", "cold", "flatten", "warn_unused_result", "nonnull", "returns_nonnull", "carries_dependency",
    "no_unique_address", "packed", "may_alias", "vector_size", "assume_aligned",
})
# `__builtin_*` names the candidate may use (math.h's INFINITY/NAN/HUGE_VAL expand to some of them;
# `__builtin_align__` is CUDA's alignment macro).
ALLOWED_BUILTINS = (r"align__|(inf|nan|nans|huge_val)(f|l|f16|f32|f64)?|expect|assume|assume_aligned|unreachable|"
                    r"is_constant_evaluated|constant_p|offsetof|bit_cast|launder|addressof|(popcount|clz|ctz|ffs|"
                    r"parity)(l|ll)?|bswap(16|32|64)|isnan|isinf|isfinite|isnormal|signbit[fl]?|fpclassify|"
                    r"(copysign|fabs|sqrt|fma|fmin|fmax)[fl]?")

_W = r"\b"
# (reason code, regex, what the feedback says). The first matching rule wins.
RULES: tuple[tuple[str, str, str], ...] = (
    ("inline_asm", _W + r"(asm|__asm__|__asm|_asm)\b", "inline assembly is not allowed"),
    ("forbidden_preprocessor", r"##|\b(_Pragma|__has_include|__has_include_next)\b",
     "token pasting, _Pragma and __has_include are not allowed"),
    ("forbidden_attribute", r"\b__declspec\b", "__declspec is not allowed"),
    ("library_call", _W + r"(thrust|cub|cutlass|cute|torch|at|c10)\s*::|"
     r"\b(cublas|cudnn|cufft|curand|cusparse|cusolver|nccl)\w*",
     "library calls (cuBLAS, cuDNN, thrust, cub, ...) are not allowed: write the kernel"),
    ("memory_allocation", _W + r"(malloc|calloc|realloc|free|alloca|mmap|sbrk|posix_memalign|aligned_alloc|"
     r"cudaMalloc\w*|cudaFree\w*|cudaHostAlloc|cudaMallocHost|cudaMallocManaged|cudaMallocAsync|"
     r"cudaHostRegister|new|delete)\b",
     "the harness allocates all memory: no malloc/new/cudaMalloc in the candidate"),
    ("extra_stream", _W + r"(cudaStream(?!_t\b)\w*|cudaLaunchHostFunc|cudaGraph\w*|cudaLaunchCooperative\w*|"
     r"cudaStreamPerThread|cudaStreamLegacy)\b",
     "use only the stream passed to solution(): no stream creation, capture or host callbacks"),
    ("host_thread", _W + r"(pthread\w*|fork|vfork|clone|thrd_create|std\s*::\s*(thread|jthread|async))\b",
     "host threads and processes are not allowed"),
    ("timer_tampering", _W + r"(cudaEvent\w*|cudaDeviceReset|cudaSetDevice\w*|cudaDeviceSetLimit|cudaProfiler\w*|"
     r"cudaCtx\w*|cu[A-Z]\w*|clock_gettime|gettimeofday|cudaDeviceSynchronize|cudaStreamSynchronize)\b",
     "events, device resets/synchronisation and driver-API calls are not allowed: the harness times and syncs"),
    ("host_syscall", _W + r"(system|popen|exec[lv]p?e?|execvpe|fexecve|fopen|freopen|open|openat|creat|socket|"
     r"connect|bind|listen|accept|send|sendto|sendmsg|recv|recvfrom|recvmsg|unlink|unlinkat|remove|rename|"
     r"renameat2?|kill|raise|exit|_exit|_Exit|quick_exit|at_quick_exit|atexit|__cxa_\w+|__dso_handle|abort|"
     r"getenv|setenv|putenv|environ|dlopen|dlsym|dlvsym|dlclose|dladdr|syscall|ioctl|signal|sigaction|sleep|"
     r"usleep|nanosleep|chdir|mkdir|rmdir|fwrite|fputs|fprintf|printf|puts|write|read|ptrace|prctl|setrlimit|"
     r"mprotect)\b|\bstd\s*::\s*(cout|cerr|ofstream|ifstream|fstream|filesystem)\b",
     "host system calls, process exit, file/network I/O and printing are not allowed"),
    ("forbidden_api", _W + r"(cudaMemcpy\w*|cudaMemset(?!Async\b)\w*|cudaIpc\w*|cudaDeviceEnablePeerAccess|"
     r"cudaHost\w*|cudaGetSymbol\w*|cudaFuncGetAddress|cudaLaunch(?:Kernel(?!ExC?\b)\w*|Device\w*|_ptsz)?|"
     r"cudaGetDriverEntryPoint\w*|__cuda\w*)\b",
     "host<->device copies and runtime calls other than kernel launches (`<<<...>>>` or cudaLaunchKernelEx) and "
     "cudaMemsetAsync are not allowed"),
    ("forbidden_builtin", rf"\b__builtin_(?!(?:{ALLOWED_BUILTINS})\b)\w+",
     "this __builtin_ function is not allowed (only math and optimisation hints)"),
)
_COMPILED = tuple((code, re.compile(rx, re.MULTILINE), msg) for code, rx, msg in RULES)
_TORCH_EXTENSION_RULES = tuple(
    (code, re.compile(rx.replace("|torch|at|c10)", ")"), re.MULTILINE) if code == "library_call" else compiled, msg)
    for (code, rx, msg), (_, compiled, _) in zip(RULES, _COMPILED))
_INCLUDE = re.compile(r'include\s*(?:<([^<>"\n]+)>|"([^<>"\n]+)")\s*$')
_ENTRY = re.compile(r'extern\s+"C"\s+(__host__\s+)?void\s+solution\s*\(')
_DIRECTIVE = re.compile(r"^[ \t\f\v]*#[ \t\f\v]*(\w*)(.*)$", re.MULTILINE)
_RESERVED_DEFINE = re.compile(r"(define|undef)\s+(__\w*|_[A-Z]\w*)")
_TOKEN = re.compile(r"""
    (?P<comment>//[^\n]*|/\*.*?(?:\*/|\Z))
  | (?P<raw>\b(?:u8|u|U|L)?R")
  | (?P<string>(?:\b(?:u8|u|U|L))?"(?:\\.|[^"\\\n])*"?)
  | (?P<char>(?:\b(?:u8|u|U|L))?'(?:\\.|[^'\\\n])*'?)
  | (?P<number>\.?\d(?:[eEpP][+-]|'[0-9A-Za-z_]|[0-9A-Za-z_.])*)
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<digraph>%:%:|%:|<:|:>|<%|%>)
""", re.DOTALL | re.VERBOSE)
_DIGRAPHS = {"%:%:": "##", "%:": "#", "<:": "[", ":>": "]", "<%": "{", "%>": "}"}
_ATTRIBUTE_START = re.compile(r"\b__attribute(?:__)?\s*\(\s*\(|\[\s*\[")
_MARKER = re.compile(r'# (\d+) "((?:[^"\\]|\\.)*)"((?: [1-4])*)')
_PRAGMA = re.compile(r"#\s*pragma\b(.*)")
_UNROLL = re.compile(r"\s+unroll\b[\w\s()+\-*/]*")


class _Refused(Exception):
  def __init__(self, rejection: Rejection):
    super().__init__(rejection.message)
    self.rejection = rejection


def _splice(source: str) -> str:
  """Joins `\\`-continued lines (GCC also accepts blanks after the `\\`), keeping the line count: the
  joined line is followed by as many empty lines as it absorbed."""
  lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
  out, pending = [], 0
  current = ""
  for line in lines:
    stripped = line.rstrip(" \t\f\v")
    if stripped.endswith("\\"):
      current += stripped[:-1]
      pending += 1
      continue
    out.append(current + line)
    out.extend([""] * pending)
    current, pending = "", 0
  if current:
    out.append(current)
  return "\n".join(out)


def _scan(text: str, keep_strings: bool) -> str:
  """Comments become blanks (their newlines kept), digraphs their plain spelling; string and character
  literals keep their contents only with `keep_strings`. Raw string literals are refused: they are the
  one token that spans lines and would let text hide from these checks."""

  def token(m: re.Match) -> str:
    kind, text_ = m.lastgroup, m.group(0)
    if kind == "comment":
      return "\n" * text_.count("\n") + " "
    if kind == "raw":
      raise _Refused(Rejection("forbidden_preprocessor", "raw string literals are not allowed",
                               m.string.count("\n", 0, m.start()) + 1))
    if kind in ("string", "char") and not keep_strings:
      quote = '"' if kind == "string" else "'"
      return text_[:text_.index(quote)] + quote * 2
    if kind == "digraph":
      after = m.string[m.end():m.end() + 2]
      if text_ == "<:" and after[:1] == ":" and after[1:2] not in (":", ">"):
        return text_  # `<::` is `<` followed by `::` (C++11)
      return _DIGRAPHS[text_]
    return text_

  return _TOKEN.sub(token, text)


def normalise(source: str) -> str:
  """The source with lines spliced, comments removed and digraphs normalised; strings kept."""
  return _scan(_splice(source), keep_strings=True)


def strip_literals(code: str) -> str:
  """`normalise`d code with the contents of string and character literals removed."""
  return _scan(code, keep_strings=False)


def _line_of(text: str, pos: int) -> int:
  return text.count("\n", 0, pos) + 1


def _attribute_body(code: str, start: int, opening: str) -> str | None:
  """The text inside the bracket pair that opens at `start` (`((`/`[[`'s inner bracket), or None when
  it does not close within MAX_ATTRIBUTE_CHARS."""
  closing = ")" if opening == "(" else "]"
  depth = 0
  for i in range(start, min(len(code), start + MAX_ATTRIBUTE_CHARS)):
    if code[i] == opening:
      depth += 1
    elif code[i] == closing:
      depth -= 1
      if depth == 0:
        return code[start + 1:i]
  return None


def _split_top(body: str) -> list[str]:
  """`body` split at the commas outside any brackets."""
  items, depth, start = [], 0, 0
  for i, c in enumerate(body):
    if c in "([{":
      depth += 1
    elif c in ")]}":
      depth -= 1
    elif c == "," and depth == 0:
      items.append(body[start:i])
      start = i + 1
  items.append(body[start:])
  return [item.strip() for item in items if item.strip()]


def _attribute_name(item: str) -> str | None:
  """The attribute an item of a group names (`gnu::` and `__x__` spellings reduced), or None when the
  item cannot be read as one (a `using` prefix, another namespace)."""
  name = re.match(r"(?:(\w+)\s*::\s*)?(\w+)\s*(\(|$)", item)
  if name is None or item.startswith("using") or (name.group(1) and name.group(1).strip("_") != "gnu"):
    return None
  return name.group(2).strip("_") or name.group(2)


def _check_attributes(code: str) -> Rejection | None:
  """Every `__attribute__((...))` and `[[...]]` group must be short, not nested and name only
  ALLOWED_ATTRIBUTES (each group is read once, so the cost is linear in the code)."""
  for m in _ATTRIBUTE_START.finditer(code):
    opening = "(" if m.group(0).startswith("__") else "["
    body = _attribute_body(code, code.index(opening, code.index(opening, m.start()) + 1), opening)
    if body is None or _ATTRIBUTE_START.search(body):
      bad = code[m.start():m.start() + 40]
    else:
      bad = next((item for item in _split_top(body) if _attribute_name(item) not in ALLOWED_ATTRIBUTES), None)
    if bad is not None:
      return Rejection("forbidden_attribute", f"attribute `{bad.split('(')[0].strip()[:40]}` is not allowed; "
                       f"allowed: {', '.join(sorted(ALLOWED_ATTRIBUTES))}", _line_of(code, m.start()))
  return None


def _apply_rules(code: str, rules=_COMPILED) -> Rejection | None:
  """`rules` (default `RULES`), then the attribute allow-list, on literal-free code."""
  for reason, rx, message in rules:
    match = rx.search(code)
    if match:
      return Rejection(reason, f"`{match.group(0).strip()}`: {message}", _line_of(code, match.start()))
  return _check_attributes(code)


def _check_directives(code: str, includes: frozenset[str] = ALLOWED_INCLUDES) -> Rejection | None:
  """Directive names, `#include` forms and names (in `includes`), `#pragma unroll`, reserved macro names."""
  for m in _DIRECTIVE.finditer(code):
    name, rest, line = m.group(1), m.group(2), _line_of(code, m.start())
    if name not in ALLOWED_DIRECTIVES or (name == "pragma" and not _UNROLL.fullmatch(rest)):
      return Rejection("forbidden_preprocessor", f"`#{name}`: only #include, #define, #undef, conditionals, "
                       "#error, #warning and `#pragma unroll` are allowed (no #line, line markers, "
                       "#include_next, other pragmas)", line)
    if name == "include":
      include = _INCLUDE.fullmatch(("include" + rest).strip())
      header = include and (include.group(1) or include.group(2)).strip()
      if header not in includes:
        written = rest.strip()[:80]
        return Rejection("forbidden_include", f"#include {written} is not allowed; allowed: "
                         f"{', '.join(sorted(includes))}", line)
    reserved = _RESERVED_DEFINE.match(name + rest)
    if reserved:
      return Rejection("forbidden_preprocessor", f"`#{reserved.group(1)} {reserved.group(2)}`: names starting with "
                       "`__` or `_` and a capital letter belong to the compiler and CUDA", line)
  return None


def _normalised(source: str) -> str | Rejection:
  """The source `normalise`d for the rules, or the Rejection of an empty, oversized or unreadable source."""
  if not source.strip():
    return Rejection("empty_source", "the CUDA source is empty")
  if len(source.encode("utf-8")) > MAX_SOURCE_BYTES:
    return Rejection("source_too_large", f"the source exceeds {MAX_SOURCE_BYTES} bytes")
  try:
    return normalise(source)
  except _Refused as e:
    return e.rejection


def check_source(source: str) -> Rejection | None:
  """Returns the first rule the source as written breaks, or None when it passes."""
  code = _normalised(source)
  if isinstance(code, Rejection):
    return code
  rejection = _check_directives(code)
  if rejection is not None:
    return rejection
  if not _ENTRY.search(code):
    return Rejection("missing_entry_point", 'no `extern "C" void solution(...)` launch function found')
  return _apply_rules(strip_literals(code))


def check_torch_extension_source(source: str, includes: frozenset[str]) -> Rejection | None:
  """The CUDA text of a KernelBench answer (`torch.utils.cpp_extension.load_inline`): the rules of
  `check_source` with `includes` allowed, no `solution` entry point required, and the `torch::`, `at::` and
  `c10::` namespaces allowed (which of their names exist is decided by compiling against the allowlisted API
  header, `kernelbench/torch_api.h`); every other library stays refused."""
  code = _normalised(source)
  if isinstance(code, Rejection):
    return code
  return _check_directives(code, includes) or _apply_rules(strip_literals(code), _TORCH_EXTENSION_RULES)


@dataclasses.dataclass
class CandidateCode:
  """The candidate's lines in one preprocessed output.

  lines: (line number in its file, text) of every line of `solution.cu` and of the harness shim.
  includes: (line of the #include, resolved path) of every file those include directly.
  problem: a line marker that renames the file, or one that leaves a file it did not enter.
  """
  lines: list[tuple[int, str]]
  includes: list[tuple[int | None, str]]
  problem: Rejection | None = None

  @property
  def text(self) -> str:
    return "\n".join(text for _, text in self.lines)


def _unescape(name: str) -> str:
  return re.sub(r'\\([0-7]{1,3}|.)', lambda m: chr(int(m.group(1), 8)) if m.group(1).isdigit() else m.group(1),
                name)


class _Frames:
  """The include stack that line markers describe (GCC's `# N "file" flags`: 1 enters, 2 returns)."""

  def __init__(self):
    self.stack: list[list] = []  # [file, pushed from a candidate frame, index in code.includes]
    self.started = False
    self.code = CandidateCode([], [])

  def in_candidate(self) -> bool:
    return len(self.stack) == 1 and self.stack[0][0] in (SOURCE_NAME, SHIM_FILENAME)

  def marker(self, line: int, name: str, flags: str) -> None:
    if not self.stack:
      self.stack.append([name, False, None])
    elif "1" in flags.split():
      from_candidate = self.in_candidate()
      if from_candidate:
        self.code.includes.append((None, name))
      self.stack.append([name, from_candidate, len(self.code.includes) - 1 if from_candidate else None])
    elif "2" in flags.split():
      self._leave(line, name)
    elif name != self.stack[-1][0]:
      self._rename(line, name)

  def _leave(self, line: int, name: str) -> None:
    left = self.stack.pop() if len(self.stack) > 1 else None
    if left is None or self.stack[-1][0] != name:
      self._refuse(line, "a line marker leaves a file that was never entered")
    elif left[1]:
      self.code.includes[left[2]] = (line - 1, left[0])

  def _rename(self, line: int, name: str) -> None:
    """Only GCC's own renames pass: at the top level, between the source and <built-in> and
    <command-line> before the source's code starts, and the harness shim's `#line` after it."""
    current = self.stack[-1][0]
    start = (SOURCE_NAME, "<built-in>", "<command-line>")
    if len(self.stack) == 1 and not self.started and current in start and name in start:
      self.started = current == "<command-line>" and name == SOURCE_NAME
    elif len(self.stack) != 1 or (current, name) != (SOURCE_NAME, SHIM_FILENAME):
      self._refuse(line, "a line marker renames the file (`#line`): the code would be attributed elsewhere")
    self.stack[-1][0] = name

  def _refuse(self, line: int, message: str) -> None:
    if self.code.problem is None:
      self.code.problem = Rejection("forbidden_preprocessor", message, line)


def candidate_code(text: str) -> CandidateCode:
  """The candidate's own lines (and direct includes) in a preprocessed output, from its line markers.

  Text at column 0 starting with `#` is GCC's: it prints a blank before any `#` that came from source
  tokens, so the candidate cannot forge a line marker or a pragma line.
  """
  frames = _Frames()
  line = 1
  for raw in text.split("\n"):
    marker = _MARKER.fullmatch(raw) if raw.startswith("# ") else None
    if marker:
      line = int(marker.group(1))
      frames.marker(line, _unescape(marker.group(2)), marker.group(3))
      continue
    if frames.in_candidate():
      frames.code.lines.append((line, raw))
    line += 1
  if not frames.code.lines and frames.code.problem is None:
    frames.code.problem = Rejection("static_check_failed", f"no line of {SOURCE_NAME} in the preprocessed output")
  return frames.code


def _inside(path: str, roots: Sequence[str]) -> bool:
  real = os.path.realpath(path)
  return any(real.startswith(os.path.realpath(r).rstrip("/") + "/") for r in roots)


def _check_includes(code: CandidateCode, toolkit_root: str) -> Rejection | None:
  for line, path in code.includes:
    name = os.path.basename(path)
    roots = (toolkit_root, *SYSTEM_INCLUDE_ROOTS)
    if name not in ALLOWED_INCLUDES or not os.path.isabs(path) or not _inside(path, roots):
      return Rejection("forbidden_include", f"#include of `{name[:80]}` is not allowed; allowed: "
                       f"{', '.join(sorted(ALLOWED_INCLUDES))}", line)
  return None


def _check_lines(code: CandidateCode) -> Rejection | None:
  """Pragma lines and other column-0 `#` lines among the candidate's lines, and the expansion size."""
  if sum(len(t) + 1 for _, t in code.lines) > MAX_EXPANDED_BYTES:
    return Rejection("preprocess_too_large", f"the source expands to more than {MAX_EXPANDED_BYTES} bytes of code")
  for line, text in code.lines:
    if text.startswith("#"):
      pragma = _PRAGMA.fullmatch(text)
      if pragma is None or not _UNROLL.fullmatch(pragma.group(1)):
        return Rejection("forbidden_preprocessor", f"`{text[:60]}`: only `#pragma unroll` is allowed", line)
  return None


def check_preprocessed(text: str, toolkit_root: str, log: str = "") -> Rejection | None:
  """Returns the first rule the candidate's code in one preprocessed output breaks, or None.

  Args:
    text: nvcc -E output of the candidate (plus the harness shim), compiled as `solution.cu`.
    toolkit_root: the CUDA toolkit folder; headers must resolve inside it or `SYSTEM_INCLUDE_ROOTS`.
    log: the preprocessor's messages (compiled with -Wpedantic, which reports GNU line markers).
  """
  if "style of line directive is a GCC extension" in log:
    return Rejection("forbidden_preprocessor", "line markers (`# 12 \"file\"`) are not allowed")
  code = candidate_code(text)
  rejection = code.problem or _check_includes(code, toolkit_root) or _check_lines(code)
  if rejection is not None:
    return rejection
  try:
    flat = strip_literals(code.text)
  except _Refused as e:
    return e.rejection
  rejection = _apply_rules(flat)
  if rejection is not None and rejection.line is not None:
    rejection = dataclasses.replace(rejection, line=code.lines[rejection.line - 1][0])
  return rejection
