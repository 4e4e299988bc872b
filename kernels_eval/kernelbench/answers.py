"""KernelBench's CUDA answer format, parent side (no torch): a Python file with a `ModelNew` whose kernels
are built by `torch.utils.cpp_extension.load_inline(name=..., cpp_sources=..., cuda_sources=..., functions=[...])`.

`check_answer(source)` reads the file with `ast`, never running it. Allowed at top level: a docstring; the
imports in ALLOWED_IMPORTS; string constants (literals, implicit or `+` concatenation of earlier ones);
assignments of one `load_inline(...)` call whose keywords are in LOAD_INLINE_KEYWORDS (no extra link flags,
include paths or build folders) with literal or constant values, extra compiler flags only from SAFE_FLAGS;
`class ModelNew`. The CUDA text
(`cpp_sources` then `cuda_sources`) gets the CUDA backend's rules (`check_torch_extension_source`), with
TORCH_INCLUDES allowed; every name in `functions` must be declared in `cpp_sources`.

`compile_answer(answer)` compiles that text with nvcc, jailed, into an object file (cached like every
candidate compile), with the answer's torch includes replaced by `torch_api.h`: the subset of the torch C++
API an answer may use, declared with torch's signatures. A call outside it does not compile. Nothing of
the answer runs on a CPU: its verdict is `not_run: no GPU` after the compile. On a GPU the worker builds the
same parts with torch's own `load_inline` and headers (`kernelbench.cuda_runner`).
"""
from __future__ import annotations

import ast
import dataclasses
import pathlib
import re

from kernels_eval.cuda import compile as compile_lib
from kernels_eval.cuda import static_check as cuda_static_check
from kernels_eval.cuda import toolchain as toolchain_lib
from kernels_eval.static_check import Rejection

ALLOWED_IMPORTS = {("import", "torch", None), ("import", "torch.nn", "nn"), ("import", "torch.nn.functional", "F"),
                   ("from", "torch.utils.cpp_extension", "load_inline"), ("import", "math", None)}
LOAD_INLINE_KEYWORDS = ("name", "cpp_sources", "cuda_sources", "functions", "verbose", "extra_cflags",
                        "extra_cuda_cflags")
TORCH_INCLUDES = frozenset({"torch/extension.h", "torch/types.h", "ATen/cuda/CUDAContext.h"})
API_HEADER = pathlib.Path(__file__).with_name("torch_api.h")
_TORCH_INCLUDE_LINE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"](' + "|".join(map(re.escape, TORCH_INCLUDES))
                                 + r')[>"][ \t]*$', re.MULTILINE)
FORMAT = "kernelbench_answer_format"
# Compiler flags an answer may pass (extra_cflags / extra_cuda_cflags); "" entries are dropped.
SAFE_FLAGS = re.compile(r"-O[0-3]|--?use_fast_math|-std=c\+\+(14|17|20)|-lineinfo|-DNDEBUG")


@dataclasses.dataclass(frozen=True)
class Answer:
  """The parts of an answer that are compiled: the C++ declarations, the CUDA source, the bound functions and
  the extra compiler flags (each in SAFE_FLAGS)."""
  cpp_source: str
  cuda_source: str
  functions: tuple[str, ...]
  extra_cflags: tuple[str, ...] = ()
  extra_cuda_cflags: tuple[str, ...] = ()

  def to_job(self) -> dict:
    return dataclasses.asdict(self)


class _Bad(Exception):
  pass


def _import_key(node: ast.stmt) -> set[tuple]:
  if isinstance(node, ast.Import):
    return {("import", a.name, a.asname) for a in node.names}
  return {("from", node.module, a.name) for a in node.names if a.asname is None} | (
      {("bad",)} if node.level or any(a.asname for a in node.names) else set())


def _value(node: ast.expr, strings: dict[str, str]):
  """A literal, a known string constant, a `+` of strings or a list of those."""
  if isinstance(node, ast.Name) and node.id in strings:
    return strings[node.id]
  if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
    left, right = _value(node.left, strings), _value(node.right, strings)
    if isinstance(left, str) and isinstance(right, str):
      return left + right
    raise _Bad("only strings may be concatenated")
  if isinstance(node, (ast.List, ast.Tuple)):
    return [_value(e, strings) for e in node.elts]
  try:
    return ast.literal_eval(node)
  except ValueError:
    raise _Bad(f"line {node.lineno}: values must be literals or string constants") from None


def _load_inline(call: ast.Call, strings: dict[str, str]) -> dict:
  if call.args or not all(k.arg in LOAD_INLINE_KEYWORDS for k in call.keywords):
    raise _Bad(f"load_inline takes only the keywords {', '.join(LOAD_INLINE_KEYWORDS)}")
  kw = {k.arg: _value(k.value, strings) for k in call.keywords}
  for key in ("cpp_sources", "cuda_sources"):
    kw[key] = "\n".join(kw[key]) if isinstance(kw.get(key), list) else kw.get(key, "")
    if not isinstance(kw[key], str):
      raise _Bad(f"{key} must be a string or a list of strings")
  if not (isinstance(kw.get("functions"), list) and kw["functions"] and all(
      isinstance(f, str) and f.isidentifier() for f in kw["functions"])):
    raise _Bad("functions must be a non-empty list of function names")
  for key in ("extra_cflags", "extra_cuda_cflags"):
    flags = kw.get(key) or []
    if not (isinstance(flags, list) and all(isinstance(f, str) and (not f or SAFE_FLAGS.fullmatch(f))
                                            for f in flags)):
      raise _Bad(f"{key} must be a list of flags from {SAFE_FLAGS.pattern}")
    kw[key] = tuple(f for f in flags if f)
  return kw


def _parse(source: str) -> Answer:
  try:
    tree = ast.parse(source)
  except SyntaxError as e:
    raise _Bad(f"syntax error on line {e.lineno}: {e.msg}") from None
  strings: dict[str, str] = {}
  calls, has_model = [], False
  for i, node in enumerate(tree.body):
    if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
      continue
    if isinstance(node, (ast.Import, ast.ImportFrom)) and not _import_key(node) - ALLOWED_IMPORTS:
      continue
    if isinstance(node, ast.ClassDef) and node.name == "ModelNew" and not has_model:
      has_model = True
      continue
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
      value = node.value
      if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "load_inline":
        calls.append(_load_inline(value, strings))
        continue
      text = _value(value, strings)
      if isinstance(text, str):
        strings[node.targets[0].id] = text
        continue
    raise _Bad(f"line {node.lineno}: only the allowed imports, string constants, load_inline(...) and "
               "class ModelNew may appear at top level")
  if not has_model or len(calls) != 1:
    raise _Bad("the answer must define class ModelNew and build its kernels with exactly one load_inline call")
  kw = calls[0]
  return Answer(kw["cpp_sources"], kw["cuda_sources"], tuple(kw["functions"]), kw["extra_cflags"],
                kw["extra_cuda_cflags"])


def check_answer(source: str) -> tuple[Answer | None, Rejection | None]:
  """(answer, None) when it passes the checks of the module docstring, else (None, rejection)."""
  try:
    answer = _parse(source)
  except _Bad as e:
    return None, Rejection(FORMAT, f"not a KernelBench answer (ModelNew + load_inline): {e}")
  for text in (answer.cpp_source, answer.cuda_source):
    rejection = cuda_static_check.check_torch_extension_source(text, cuda_static_check.ALLOWED_INCLUDES
                                                               | TORCH_INCLUDES)
    if rejection is not None:
      return None, rejection
  missing = [f for f in answer.functions if not re.search(rf"\b{f}\s*\(", answer.cpp_source)]
  if missing:
    return None, Rejection(FORMAT, f"functions {missing} are not declared in cpp_sources")
  return answer, None


def compile_answer(answer: Answer) -> compile_lib.CompileResult:
  """nvcc -c of the API header, cpp_sources and cuda_sources as one translation unit (module docstring)."""
  tc = toolchain_lib.find_toolchain()
  body = _TORCH_INCLUDE_LINE.sub("", answer.cpp_source + "\n" + answer.cuda_source)
  flags = ["-c", "-O3", "-std=c++17", f"-arch={toolchain_lib.target_arch()}", "-Xcompiler", "-fPIC"]
  return compile_lib.compile_source(API_HEADER.read_text() + "\n" + body, tc=tc, flags=flags, suffix=".o")
