"""Static checks on untrusted Python (Pallas candidates and generated tasks' references).

Parsed with `ast`, never executed. A finding is a `Rejection(reason, message, line)`; `reason` is a short
snake_case code that becomes `EvalResult.rejected_reason`. The rules: imports only from an allow-list;
no builtins that reach files, processes, the interpreter or attributes by name (`open`, `exec`,
`getattr`, `__import__`, ...); no dunder or private attribute access; no escape hatches of JAX (host
callbacks, `jax.config`, file I/O); no mutable module-level state (globals, attribute assignment,
mutable module-level values or default arguments, caching decorators); no `interpret=`/`backend=`
arguments, which belong to the harness.
"""
from __future__ import annotations

import ast
import dataclasses
import threading

MAX_SOURCE_BYTES = 64 << 10
PALLAS_MODULES = frozenset({"jax", "jax.numpy", "jax.lax", "jax.experimental.pallas",
                            "jax.experimental.pallas.triton", "functools", "math"})
REFERENCE_MODULES = frozenset({"jax", "jax.numpy", "jax.lax", "math"})
NETWORK_MODULES = frozenset({"socket", "ssl", "http", "urllib", "urllib3", "requests", "ftplib", "smtplib",
                             "asyncio", "select", "selectors", "xmlrpc", "socketserver", "telnetlib"})
FORBIDDEN_NAMES = frozenset({
    "eval", "exec", "compile", "open", "__import__", "getattr", "setattr", "delattr", "globals", "locals",
    "vars", "input", "breakpoint", "memoryview", "exit", "quit", "help", "dir", "__builtins__"})
FORBIDDEN_ATTRS = frozenset({
    "config", "callback", "pure_callback", "io_callback", "debug_callback", "host_callback", "save",
    "savez", "savez_compressed", "fromfile", "tofile", "profiler", "distributed", "extend", "ffi", "dlpack",
    "from_dlpack", "clear_caches", "live_arrays", "cache", "lru_cache", "cached_property", "system",
    "popen", "environ", "modules", "interpreters", "version",
    # frames, code and tracebacks reach the harness's globals without a dunder name
    "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "ag_frame", "ag_code", "f_back",
    "f_globals", "f_locals", "f_builtins", "f_code", "tb_frame", "tb_next", "co_code", "co_consts"})
HARNESS_KWARGS = frozenset({"interpret", "backend"})
SAFE_MODULE_CALLS = frozenset({"int", "float", "bool", "str", "tuple", "frozenset", "abs", "min", "max",
                               "range", "len", "round"})
MUTABLE_DISPLAYS = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp, ast.GeneratorExp)


@dataclasses.dataclass(frozen=True)
class Rejection:
  reason: str
  message: str
  line: int | None = None

  def feedback(self) -> str:
    where = f" (line {self.line})" if self.line else ""
    return f"rejected by the static check [{self.reason}]{where}: {self.message}"


class _Found(Exception):
  def __init__(self, rejection: Rejection):
    super().__init__(rejection.message)
    self.rejection = rejection


def _reject(reason: str, message: str, node: ast.AST | None = None):
  raise _Found(Rejection(reason, message, getattr(node, "lineno", None)))


def _import_reason(module: str) -> str:
  root = module.split(".")[0]
  return "network_access" if root in NETWORK_MODULES else "forbidden_import"


class _Checker(ast.NodeVisitor):
  """Walks a module; `allowed` are the importable modules."""

  def __init__(self, allowed: frozenset[str]):
    self.allowed = allowed
    self.module_aliases: set[str] = set()

  def visit_Import(self, node: ast.Import):
    for alias in node.names:
      if alias.name not in self.allowed:
        _reject(_import_reason(alias.name), f"import of {alias.name!r} is not allowed "
                f"(allowed: {', '.join(sorted(self.allowed))})", node)
      self.module_aliases.add(alias.asname or alias.name.split(".")[0])

  def visit_ImportFrom(self, node: ast.ImportFrom):
    if node.level or node.module is None:
      _reject("forbidden_import", "relative imports are not allowed", node)
    for alias in node.names:
      full = f"{node.module}.{alias.name}"
      if alias.name == "*":
        _reject("forbidden_import", f"`from {node.module} import *` is not allowed", node)
      if full in self.allowed:
        self.module_aliases.add(alias.asname or alias.name)
        continue
      if node.module not in self.allowed:
        _reject(_import_reason(node.module), f"import from {node.module!r} is not allowed "
                f"(allowed: {', '.join(sorted(self.allowed))})", node)
      self._check_attr_name(alias.name, node)

  def _check_attr_name(self, name: str, node: ast.AST):
    if name.startswith("__"):
      _reject("dunder_access", f"access to {name!r} is not allowed", node)
    if name.startswith("_"):
      _reject("private_access", f"access to the private name {name!r} is not allowed", node)
    if name in FORBIDDEN_ATTRS:
      _reject("forbidden_api", f"{name!r} is not allowed in kernel code", node)

  def visit_Name(self, node: ast.Name):
    if node.id in FORBIDDEN_NAMES:
      _reject("forbidden_builtin", f"the builtin {node.id!r} is not allowed", node)
    if node.id.startswith("__"):
      _reject("dunder_access", f"access to {node.id!r} is not allowed", node)

  def visit_Attribute(self, node: ast.Attribute):
    self._check_attr_name(node.attr, node)
    if isinstance(node.ctx, (ast.Store, ast.Del)):
      _reject("mutable_global_state", "assigning attributes is not allowed (no state outside function "
              "locals and kernel refs)", node)
    self.generic_visit(node)

  def visit_Constant(self, node: ast.Constant):
    if isinstance(node.value, str) and "__" in node.value and any(
        f"__{w}" in node.value for w in ("class", "globals", "builtins", "subclasses", "import", "dict")):
      _reject("dunder_access", "strings naming interpreter internals are not allowed", node)

  def visit_Global(self, node: ast.Global):
    _reject("mutable_global_state", "`global` is not allowed (no mutable module-level state)", node)

  def visit_Nonlocal(self, node: ast.Nonlocal):
    _reject("mutable_global_state", "`nonlocal` is not allowed (no state kept across calls)", node)

  def visit_ClassDef(self, node: ast.ClassDef):
    _reject("forbidden_construct", "class definitions are not allowed in kernel code", node)

  def visit_AsyncFunctionDef(self, node):
    _reject("forbidden_construct", "async functions are not allowed", node)

  def _check_function(self, node: ast.FunctionDef | ast.Lambda):
    args = node.args
    for default in args.defaults + [d for d in args.kw_defaults if d is not None]:
      if any(isinstance(n, MUTABLE_DISPLAYS + (ast.Call,)) for n in ast.walk(default)):
        _reject("mutable_global_state", "default arguments must be immutable constants (a mutable "
                "default keeps state across calls)", default)

  def visit_FunctionDef(self, node: ast.FunctionDef):
    self._check_function(node)
    self.generic_visit(node)

  def visit_Lambda(self, node: ast.Lambda):
    self._check_function(node)
    self.generic_visit(node)

  def visit_Call(self, node: ast.Call):
    for kw in node.keywords:
      if kw.arg in HARNESS_KWARGS:
        _reject("harness_option", f"do not pass `{kw.arg}=`: the harness selects interpret mode on CPU "
                "and the Triton lowering on GPU", node)
    self.generic_visit(node)

  def _module_level_value(self, value: ast.AST, node: ast.stmt):
    for n in ast.walk(value):
      if isinstance(n, MUTABLE_DISPLAYS):
        _reject("mutable_global_state", "module-level values must be immutable (no list/dict/set: "
                "no state may persist across calls)", node)
      if isinstance(n, ast.Call):
        root = n.func
        while isinstance(root, ast.Attribute):
          root = root.value
        ok = isinstance(root, ast.Name) and (
            (root.id in self.module_aliases and root is not n.func) or
            (root is n.func and root.id in SAFE_MODULE_CALLS))
        if not ok:
          _reject("mutable_global_state", "module-level calls are limited to jax/functools/math functions "
                  "and int/float/tuple (no state may persist across calls)", node)

  def check_module(self, tree: ast.Module):
    for node in tree.body:
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        self.visit(node)
    for node in tree.body:
      if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        if isinstance(node, ast.AugAssign):
          _reject("mutable_global_state", "module-level augmented assignment is not allowed", node)
        if node.value is not None:
          self._module_level_value(node.value, node)
      elif isinstance(node, ast.FunctionDef):
        for dec in node.decorator_list:
          self._module_level_value(dec, node)
      elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        pass
      elif not isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assert,
                                 ast.AsyncFunctionDef)):
        _reject("forbidden_construct", f"top-level {type(node).__name__} statements are not allowed: only "
                "imports, constants and function definitions", node)
    self.visit(tree)


_AST_LOCK = threading.Lock()


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
  """`ast.parse` under a process-wide lock.

  The evaluator parses on several parent threads, and CPython 3.11's AST constructor keeps a global
  recursion counter that concurrent parses corrupt ("SystemError: AST constructor recursion depth
  mismatch"). Parent-process code of kernels_eval and probe parses through this function.
  """
  with _AST_LOCK:
    return ast.parse(source, filename=filename)


def _parse(source: str, filename: str) -> ast.Module | Rejection:
  if len(source.encode("utf-8")) > MAX_SOURCE_BYTES:
    return Rejection("source_too_large", f"source exceeds {MAX_SOURCE_BYTES} bytes")
  try:
    return parse_python(source, filename)
  except SyntaxError as e:
    text = (e.text or "").rstrip()
    return Rejection("syntax_error", f"{e.msg}" + (f": {text.strip()!r}" if text else ""), e.lineno)
  except ValueError as e:
    return Rejection("syntax_error", str(e))


def check_python(source: str, allowed: frozenset[str], *, filename: str = "solution.py") -> Rejection | None:
  tree = _parse(source, filename)
  if isinstance(tree, Rejection):
    return tree
  try:
    _Checker(allowed).check_module(tree)
  except _Found as f:
    return f.rejection
  return None


def check_pallas_candidate(source: str, input_names: list[str]) -> Rejection | None:
  """All rules above, plus: a top-level `solution` taking the task's inputs in order."""
  problem = check_python(source, PALLAS_MODULES)
  if problem is not None:
    return problem
  tree = parse_python(source)
  defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "solution"]
  assigned = [n for n in tree.body if isinstance(n, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == "solution" for t in n.targets)]
  if not defs and not assigned:
    return Rejection("missing_solution", "define a top-level function `solution("
                     f"{', '.join(input_names)})` that returns the output array")
  if defs:
    args = defs[-1].args
    positional = [a.arg for a in args.posonlyargs + args.args]
    required = len(positional) - len(args.defaults)
    if required > len(input_names) or (len(positional) < len(input_names) and not args.vararg):
      return Rejection("bad_signature", f"`solution` must take the inputs ({', '.join(input_names)}) in "
                       f"order; it takes ({', '.join(positional)})", defs[-1].lineno)
  return None


def check_reference(source: str) -> Rejection | None:
  """Checks a task's `reference` function (untrusted tasks) with the jax/jnp/lax/math allow-list."""
  return check_python(source, REFERENCE_MODULES, filename="reference.py")
