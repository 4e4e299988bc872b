"""The static check of untrusted Pallas candidates and references: allow-lists, refusals by name, and
failing closed on any input."""
import ast
import concurrent.futures
import functools
import importlib
import pathlib
import subprocess
import sys
import types

import pytest

import kernels_eval
from kernels_eval import skeleton
from kernels_eval import static_check
from kernels_eval.hardening import pallas_cases
from kernels_eval.hardening import pallas_static_cases
from probe import scaffold

HEAD = """import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

BLOCK = 128


def _kernel(x_ref, o_ref):
  o_ref[...] = jnp.maximum(x_ref[...], 0.0)
"""


def _solution(body: str, head: str = "") -> str:
  """HEAD, `head` at module level, then `solution(x)` running `body` (indented two spaces)."""
  return HEAD + head + "\n\ndef solution(x):\n" + body


def _reason(source: str) -> str | None:
  problem = static_check.check_pallas_candidate(source, ["x"])
  assert problem is None or isinstance(problem, static_check.Rejection)
  return problem.reason if problem else None


# (reason, refused source, a near-identical accepted source or None)
RULES = [
    # statements and expressions refused by name
    ("forbidden_construct", _solution("  match x.ndim:\n    case 1:\n      return x\n  return x\n"),
     _solution("  if x.ndim == 1:\n    return x\n  return x\n")),
    ("forbidden_construct", _solution("  match x:\n    case object(shape=s):\n      return s\n  return x\n"), None),
    ("forbidden_construct", _solution("  try:\n    y = x + 1\n  except ValueError:\n    y = x\n  return y\n"),
     _solution("  y = x + 1\n  return y\n")),
    ("forbidden_construct", _solution("  with jax.named_scope('k'):\n    return x\n"), _solution("  return x\n")),
    ("forbidden_construct", "class K:\n  pass\n" + _solution("  return x\n"),
     "def K():\n  pass\n" + _solution("  return x\n")),
    ("forbidden_construct", HEAD + "\n\nasync def solution(x):\n  return x\n",
     HEAD + "\n\ndef solution(x):\n  return x\n"),
    ("forbidden_construct", _solution("  y = x\n  del y\n  return x\n"),
     _solution("  y = x\n  y = None\n  return x\n")),
    ("forbidden_construct", _solution("  return (y := x)\n"), _solution("  y = x\n  return y\n")),
    ("forbidden_construct", _solution("  yield x\n"), _solution("  return x\n")),
    ("forbidden_construct", _solution("  return [(y := v) for v in (x,)]\n"),
     _solution("  return [v for v in (x,)]\n")),
    ("mutable_global_state", _solution("  global BLOCK\n  return x\n"), _solution("  block = BLOCK\n  return x\n")),
    ("mutable_global_state", _solution("  n = 1\n  def f():\n    nonlocal n\n    return n\n  return x\n"),
     _solution("  n = 1\n  def f():\n    return n\n  return x\n")),
    # imports
    ("forbidden_import", "import os\n" + _solution("  return x\n"), "import math\n" + _solution("  return x\n")),
    ("network_access", "import socket\n" + _solution("  return x\n"), None),
    ("forbidden_import", "import jax.nn\n" + _solution("  return x\n"),
     "from jax import nn\n" + _solution("  return x\n")),
    ("forbidden_import", _solution("  import math\n  return x\n"), "import math\n" + _solution("  return x\n")),
    ("forbidden_import", "from jax.numpy import *\n" + _solution("  return x\n"),
     "from jax.numpy import maximum\n" + _solution("  return x\n")),
    ("forbidden_import", "from . import kernels\n" + _solution("  return x\n"), None),
    ("forbidden_attribute", "from jax.numpy import load\n" + _solution("  return x\n"),
     "from jax.numpy import zeros\n" + _solution("  return x\n")),
    ("forbidden_attribute", "from functools import reduce\n" + _solution("  return x\n"),
     "from functools import partial\n" + _solution("  return x\n")),
    # names
    ("forbidden_builtin", _solution("  return getattr(x, 'shape')\n"), _solution("  return x.shape\n")),
    ("forbidden_builtin", _solution("  print(x)\n  return x\n"), _solution("  abs(x)\n  return x\n")),
    ("forbidden_builtin", _solution("  return type(x)\n"), _solution("  return isinstance(x, jax.Array)\n")),
    ("forbidden_builtin", _solution("  return [open for open in open]\n"), _solution("  return [v for v in x]\n")),
    ("forbidden_builtin", _solution("  f = lambda v, g=open: g\n  return x\n"),
     _solution("  f = lambda v, g=abs: g\n  return x\n")),
    ("undefined_name", _solution("  return helper(x)\n"),
     _solution("  return helper(x)\n") + "\n\ndef helper(v):\n  return v\n"),
    ("undefined_name", "K = _kernel\n" + _solution("  return x\n"), _solution("  return x\n", "K = _kernel\n")),
    ("dunder_access", _solution("  return __name__\n"), _solution("  return x\n")),
    ("dunder_access", _solution("  return __builtins__['len'](x)\n"), _solution("  return len(x)\n")),
    ("dunder_access", _solution("  name = '__cla' 'ss__'\n  return x\n"),
     _solution("  name = 'cla' 'ss'\n  return x\n")),
    ("dunder_access", _solution("  name = b'__class__'\n  return x\n"), _solution("  name = b'class'\n  return x\n")),
    ("dunder_access", "def __init__():\n  pass\n" + _solution("  return x\n"), None),
    # attributes
    ("format_string", _solution("  s = '{0.shape}'.format(x)\n  return x\n"),
     _solution("  s = f'{x.shape}'\n  return x\n")),
    ("format_string", _solution("  s = '{n}'.format_map({'n': x})\n  return x\n"), None),
    ("dunder_access", _solution("  s = f'{x.__class__}'\n  return x\n"),
     _solution("  s = f'{x.dtype!r:>10}'\n  return x\n")),
    ("dunder_access", _solution("  return x.__class__\n"), _solution("  return x.dtype\n")),
    ("private_access", _solution("  return x._value\n"), _solution("  return x.size\n")),
    ("forbidden_api", _solution("  jax.config.update('jax_enable_x64', True)\n  return x\n"), None),
    ("forbidden_api", _solution("  jax.debug.print('{}', x)\n  return x\n"), None),
    ("forbidden_api", _solution("  return jax.pure_callback(abs, x, x)\n"), None),
    ("forbidden_api", _solution("  return (v for v in x).gi_frame\n"), None),
    ("forbidden_attribute", _solution("  return (v for v in x).send\n"), _solution("  return sum(v for v in x)\n")),
    ("forbidden_attribute", _solution("  return x.tolist()\n"), _solution("  return x.ravel()\n")),
    ("forbidden_attribute", _solution("  return jnp.load('f.npy')\n"), _solution("  return jnp.zeros(3)\n")),
    ("forbidden_attribute", _solution("  return pl.kernel\n"), _solution("  return pl.cdiv(3, 2)\n")),
    ("forbidden_attribute", _solution("  return functools.reduce(max, (x,))\n"),
     _solution("  return functools.partial(max, x)\n")),
    ("forbidden_attribute", _solution("  return jax.random.normal\n"), _solution("  return jax.nn.relu(x)\n")),
    ("forbidden_attribute", _solution("  return jax.jit(abs).lower\n"), _solution("  return jax.jit(abs)(x)\n")),
    ("module_as_value", _solution("  m = jnp\n  return m.maximum(x, 0.0)\n"),
     _solution("  m = jnp.maximum\n  return m(x, 0.0)\n")),
    ("module_as_value", _solution("  return jax.numpy\n"), _solution("  return jax.numpy.float32\n")),
    ("shadowed_import", _solution("  jnp = x\n  return x\n"), _solution("  xs = x\n  return x\n")),
    ("shadowed_import", "jnp = None\n" + _solution("  return x\n"), "JNP = None\n" + _solution("  return x\n")),
    ("shadowed_import", HEAD + "\n\ndef solution(pl):\n  return pl\n", HEAD + "\n\ndef solution(p):\n  return p\n"),
    # import time
    ("code_at_import", _solution("  return x\n", "X = jnp.zeros(4)\n"),
     _solution("  return x\n", "X = jnp.float32(4)\n")),
    ("code_at_import", _solution("  return x\n") + "\nsolution(1)\n", _solution("  return x\n") + "\n'''Docs.'''\n"),
    ("code_at_import", _solution("  return x\n") + "\nfor i in range(3):\n  pass\n", None),
    ("code_at_import", _solution("  return x\n") + "\nif BLOCK:\n  pass\n", None),
    ("code_at_import", _solution("  return x\n") + "\nWARM = solution(1.0)\n",
     _solution("  return x\n") + "\nS = solution\n"),
    ("code_at_import", HEAD + "\n\ndef solution(x: print()):\n  return x\n",
     HEAD + "\n\ndef solution(x: jax.Array):\n  return x\n"),
    ("code_at_import", _solution("  return x\n") + "\nassert solution(1)\n",
     _solution("  return x\n") + "\nassert BLOCK % 32 == 0\n"),
    ("decorator_at_import", HEAD + "\n\n@functools.lru_cache\ndef solution(x):\n  return x\n",
     HEAD + "\n\n@jax.jit\ndef solution(x):\n  return x\n"),
    ("decorator_at_import", HEAD + "\n\n@functools.partial(jax.jit, donate_argnums=0)\ndef solution(x):\n  return x\n",
     HEAD + "\n\n@functools.partial(jax.jit, static_argnames=['n'])\ndef solution(x, n=2):\n  return x\n"),
    ("decorator_at_import", HEAD + "\n\n@_kernel\ndef solution(x):\n  return x\n", None),
    # state
    ("mutable_global_state", "CACHE = {}\n" + _solution("  return x\n"), "CACHE = ()\n" + _solution("  return x\n")),
    ("mutable_global_state", "CACHE = [v for v in (1, 2)]\n" + _solution("  return x\n"),
     "CACHE = tuple(range(2))\n" + _solution("  return x\n")),
    ("mutable_global_state", _solution("  return x\n", "BLOCK += 1\n"),
     _solution("  return x\n", "BLOCK2 = BLOCK + 1\n")),
    ("mutable_global_state", HEAD + "\n\ndef solution(x, memo={}):\n  return x\n",
     HEAD + "\n\ndef solution(x, memo=()):\n  return x\n"),
    ("mutable_global_state", HEAD + "\n\ndef solution(x, memo=jnp.zeros(3)):\n  return x\n",
     HEAD + "\n\ndef solution(x, memo=jnp.float32):\n  return x\n"),
    ("mutable_global_state", _solution("  f = lambda v, memo=[]: memo\n  return x\n"),
     _solution("  f = lambda v, b=BLOCK: b\n  return x\n")),
    ("mutable_global_state", _solution("  return x\n") + "\nsolution.memo = None\n", None),
    ("mutable_global_state", _solution("  x.memo = None\n  return x\n"), None),
    ("mutable_global_state", "TABLE = (0,)\n" + _solution("  TABLE[0] = x\n  return x\n"),
     "TABLE = (0,)\n" + _solution("  table = [0]\n  table[0] = x\n  return x\n")),
    ("mutable_global_state", HEAD + "\n\ndef k(x_ref, o_ref):\n  jnp.ones[0] = 1\n" + _solution("  return x\n"),
     HEAD + "\n\ndef k(x_ref, o_ref):\n  def body(i, c):\n    o_ref.at[i][...] = c\n    return c\n  return body\n"
     + _solution("  return x\n")),
    # harness options
    ("harness_option", _solution("  return pl.pallas_call(_kernel, out_shape=x, interpret=True)(x)\n"),
     _solution("  return pl.pallas_call(_kernel, out_shape=x)(x)\n")),
    ("harness_option", _solution("  return pl.pallas_call(_kernel, out_shape=x, **{'backend': 'triton'})(x)\n"), None),
]


@pytest.mark.parametrize("reason,refused,accepted", RULES, ids=[f"{r[0]}-{i}" for i, r in enumerate(RULES)])
def test_each_rule_refuses_and_its_neighbour_passes(reason, refused, accepted):
  assert _reason(refused) == reason, static_check.check_pallas_candidate(refused, ["x"])
  if accepted is not None:
    assert _reason(accepted) is None, static_check.check_pallas_candidate(accepted, ["x"])


def test_nested_decorators_run_with_their_function():
  """A nested function's decorators run when the enclosing function runs, like any call there."""
  src = _solution("  @pl.when(x > 0)\n  def _():\n    pass\n  return x\n")
  assert _reason(src) is None


def test_scopes_follow_python():
  """Module-level code sees only earlier names; function bodies see the whole module."""
  late = _solution("  return helper(x) + LATE\n") + "\n\ndef helper(v):\n  return v\n\n\nLATE = 1\n"
  assert _reason(late) is None
  assert _reason("EARLY = LATE\nLATE = 1\n" + _solution("  return x\n")) == "undefined_name"
  assert _reason(_solution("  open = abs\n  return open(x)\n")) is None  # a local of its own


TOO_DEEP = "too_deeply_nested"
PATHOLOGICAL = [
    ("parens_1e5", "x = " + "(" * 100_000 + "1" + ")" * 100_000, "source_too_large"),
    ("unary_1e5", "x = " + "-" * 100_000 + "1", "source_too_large"),
    ("binop_1e5", "x = " + "1+" * 100_000 + "1", "source_too_large"),
    ("ten_megabytes", "x = 1\n" * 1_750_000, "source_too_large"),
    ("wide_characters", "s = '" + "\u00e9" * 40_000 + "'\n", "source_too_large"),
    ("parens", "x = " + "(" * 1000 + "1" + ")" * 1000, TOO_DEEP),
    ("unary", "x = " + "-" * 60_000 + "1", TOO_DEEP),
    ("not", "x = " + "not " * 15_000 + "1", TOO_DEEP),
    ("binop", "x = " + "1+" * 30_000 + "1", TOO_DEEP),
    ("power", "x = " + "2**" * 20_000 + "2", TOO_DEEP),
    ("attributes", "x = a" + ".b" * 30_000, TOO_DEEP),
    ("calls", "x = f" + "()" * 30_000, TOO_DEEP),
    ("subscripts", "x = a" + "[0]" * 20_000, TOO_DEEP),
    ("lambdas", "x = " + "lambda: " * 8_000 + "1", TOO_DEEP),
    ("conditionals", "x = " + "1 if 1 else " * 5_000 + "1", TOO_DEEP),
    ("fstring", "x = f'{" + "-" * 30_000 + "1}'", TOO_DEEP),
    ("lists", "x = " + "[" * 40 + "]" * 40, TOO_DEEP),
    ("elif", "if x:\n  pass\n" + "elif x:\n  pass\n" * 3_000, TOO_DEEP),
    ("indentation", "".join("  " * i + "if x:\n" for i in range(90)) + "  " * 90 + "pass\n", TOO_DEEP),
    ("ast_depth", "def solution(x):\n  return " + "-" * 80 + "x\n", TOO_DEEP),
    ("unclosed_deep", "x = " + "-" * 60_000 + "(", TOO_DEEP),
    ("null_byte", "def solution(x):\n  return x\x00\n", "syntax_error"),
    ("surrogate", "def solution(x):\n  return '\udcff'\n", "syntax_error"),
    ("unclosed", "def solution(x):\n  return (x\n", "syntax_error"),
    ("bad_dedent", "def solution(x):\n    return x\n  y = 1\n", "syntax_error"),
    ("missing_colon", "def solution(x)\n  return x\n", "syntax_error"),
    # A `type` statement parses from Python 3.12 on (JAX 0.11 needs 3.12) and is then a forbidden construct.
    ("type_alias", "type T = int\ndef solution(x):\n  return x\n",
     "syntax_error" if sys.version_info < (3, 12) else "forbidden_construct"),
    ("bytes", b"def solution(x):\n  return x\n", "syntax_error"),
    ("none", None, "syntax_error"),
]


@pytest.mark.parametrize("source,reason", [p[1:] for p in PATHOLOGICAL], ids=[p[0] for p in PATHOLOGICAL])
def test_pathological_sources_get_a_verdict(source, reason):
  for check in (lambda s: static_check.check_pallas_candidate(s, ["x"]), static_check.check_reference,
                lambda s: static_check.check_python(s, static_check.PALLAS_MODULES)):
    problem = check(source)
    assert isinstance(problem, static_check.Rejection) and problem.reason == reason, problem


def test_checker_failures_become_rejections(monkeypatch):
  source = pallas_cases.GOOD
  monkeypatch.setattr(static_check._Checker, "check_module", lambda self, tree: {}["boom"])
  assert _reason(source) == "static_check_failed"

  def recurse(self, tree):
    return recurse(self, tree)

  monkeypatch.setattr(static_check._Checker, "check_module", recurse)
  assert _reason(source) == TOO_DEEP


def test_parser_failures_become_rejections(monkeypatch):
  def fail(error):
    def parse(source, filename="<unknown>"):
      raise error
    return parse

  for error, reason in ((MemoryError(), TOO_DEEP), (RecursionError(), TOO_DEEP), (ValueError("x"), "syntax_error"),
                        (KeyError("x"), "static_check_failed")):
    monkeypatch.setattr(static_check, "parse_python", fail(error))
    assert _reason(pallas_cases.GOOD) == reason


def test_check_near_the_recursion_limit_gives_a_verdict():
  def nest(depth):
    return nest(depth - 1) if depth else static_check.check_pallas_candidate(pallas_cases.GOOD, ["x"])

  problem = nest(sys.getrecursionlimit() - 60)
  assert problem is None or problem.reason == TOO_DEEP


def test_checks_agree_on_parallel_threads():
  sources = [case.source for case in pallas_static_cases.CASES] + [pallas_cases.GOOD] * 8
  serial = [_reason(s) for s in sources]
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    assert list(pool.map(_reason, sources * 3)) == serial * 3


def _check_candidate(source, input_names):
  return static_check.check_pallas_candidate(source, input_names)


def _trusted_sources():
  """(what, source, check) for every embedded trusted source the check must accept."""
  for task in kernels_eval.load_tasks():
    yield f"{task.id} reference", task.reference_source, static_check.check_reference
    pallas = functools.partial(_check_candidate, input_names=task.input_names)
    if "pallas" in task.solutions:
      yield f"{task.id} solution", task.solutions["pallas"], pallas
    if task.level == 0:
      answer = skeleton.skeleton_answer(task, "pallas")
      yield f"{task.id} skeleton", skeleton.fill_skeleton(task, "pallas", answer), pallas
      witness = scaffold.witness(task.reference_source)
      yield f"{task.id} witness", skeleton.fill_skeleton(task, "pallas", witness), pallas


def test_embedded_solutions_skeletons_and_references_pass():
  sources = list(_trusted_sources())
  assert len(sources) > 80
  failures = [(what, problem) for what, source, check in sources if (problem := check(source)) is not None]
  assert not failures


def test_hardening_sources_meant_to_pass_pass():
  for case in pallas_cases.CASES:
    expected = case.rejected_reason if case.stage == "static" else None
    assert _reason(case.source) == expected, case.name


@pytest.mark.parametrize("body", [
    "jnp.tanh(x) * 1.5 + x", "jax.nn.softmax(x, axis=1)", "jnp.sum(x, axis=0)", "jnp.linalg.norm(x, axis=-1)",
    "jnp.einsum('ij,kj->ik', x, x, precision=lax.Precision.HIGHEST) / math.sqrt(x.shape[-1])",
    "x.astype(jnp.float32).max(axis=1, keepdims=True).T", "jax.lax.erf(x) * jnp.finfo(x.dtype).eps",
])
def test_generated_references_pass(body):
  assert static_check.check_reference(f'def reference(x):\n  """Doc."""\n  y = {body}\n  return y\n') is None


@pytest.mark.parametrize("source,reason", [
    ("def reference(x):\n  return jax.experimental.pallas.pallas_call\n", "forbidden_attribute"),
    ("def reference(x):\n  return jnp.save('f', x)\n", "forbidden_api"),
    ("def reference(x):\n  return open('f')\n", "forbidden_builtin"),
    ("def reference(x):\n  jnp = x\n  return jnp\n", "shadowed_import"),
    ("import os\ndef reference(x):\n  return x\n", "forbidden_import"),
])
def test_reference_rules(source, reason):
  assert static_check.check_reference(source).reason == reason


@pytest.mark.parametrize("case", pallas_static_cases.CASES, ids=lambda c: c.name)
def test_static_hardening_cases(case):
  assert (case.stage, case.status) == ("static", "compile_error")
  assert _reason(case.source) == case.rejected_reason


def test_static_hardening_cases_are_named_and_many():
  names = [c.name for c in pallas_static_cases.CASES]
  assert len(names) >= 16 and len(set(names)) == len(names)
  assert not set(names) & {c.name for c in pallas_cases.CASES}


def test_module_attributes_exist_in_the_installed_jax():
  modules = {module: importlib.import_module(module) for module in static_check.MODULE_ATTRIBUTES}
  for module, names in static_check.MODULE_ATTRIBUTES.items():
    real = modules[module]
    missing = sorted(n for n in names if not hasattr(real, n))
    assert not missing, (module, missing)
    submodules = {n for n in names if isinstance(getattr(real, n), types.ModuleType)}
    assert all(f"{module}.{n}" in static_check.MODULE_ATTRIBUTES for n in submodules), (module, submodules)
  assert static_check.ALLOWED_ATTRIBUTES == static_check.VALUE_ATTRIBUTES.union(
      *static_check.MODULE_ATTRIBUTES.values())


DANGEROUS_ATTRIBUTES = (
    "format", "format_map", "config", "callback", "pure_callback", "io_callback", "debug", "debug_callback",
    "debug_print", "save", "savez", "savez_compressed", "fromfile", "frombuffer", "tofile", "environ", "system",
    "popen", "profiler", "monitoring", "extend", "ffi", "dlpack", "from_dlpack", "tree_util", "distributed",
    "gi_frame", "gi_code", "f_back", "f_globals", "f_locals", "f_builtins", "tb_frame", "co_code", "func",
    "keywords", "mro", "tobytes", "tolist", "item", "device", "devices", "default_backend", "platform_dependent",
    "clear_cache", "clear_caches", "lower", "compile", "cache", "lru_cache", "elementwise_inline_asm", "kernel",
    "core_map", "run_state", "get_global", "empty_ref_like", "enable_debug_checks", "set_printoptions",
    "printoptions", "frompyfunc", "rng_bit_generator", "send", "throw", "aval", "traceback", "version")


def test_dangerous_names_are_absent():
  assert not set(DANGEROUS_ATTRIBUTES) & static_check.ALLOWED_ATTRIBUTES
  assert not [n for n in static_check.ALLOWED_ATTRIBUTES if n.startswith("_")]
  assert "load" in static_check.MODULE_ATTRIBUTES["jax.experimental.pallas.triton"]
  assert "load" not in static_check.MODULE_ATTRIBUTES["jax.numpy"] | static_check.VALUE_ATTRIBUTES
  assert static_check.FORBIDDEN_ATTRS.isdisjoint(static_check.ALLOWED_ATTRIBUTES)
  assert static_check.FORBIDDEN_NAMES.isdisjoint(static_check.ALLOWED_BUILTINS)
  for name in ("type", "object", "super", "getattr", "format", "vars", "globals", "eval", "exec", "open",
               "__import__", "print", "compile", "breakpoint", "help", "input", "setattr", "dir"):
    assert name not in static_check.ALLOWED_BUILTINS


def test_allow_lists_are_sorted_literals():
  tree = ast.parse(pathlib.Path(static_check.__file__).read_text())
  lists = {node.targets[0].id: [e.value for e in node.value.args[0].elts] for node in tree.body
           if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and node.value.args
           and isinstance(node.value.args[0], ast.Set) and node.targets[0].id.endswith(("_ATTRIBUTES", "_BUILTINS"))}
  assert {"ALLOWED_BUILTINS", "JNP_ATTRIBUTES", "VALUE_ATTRIBUTES", "PALLAS_TRITON_ATTRIBUTES"} <= lists.keys()
  for name, values in lists.items():
    assert values == sorted(values), name


def test_the_check_never_imports_jax():
  code = "import sys\nfrom kernels_eval import static_check\nassert 'jax' not in sys.modules\n"
  subprocess.run([sys.executable, "-c", code], check=True, cwd=pathlib.Path(__file__).resolve().parents[1])
