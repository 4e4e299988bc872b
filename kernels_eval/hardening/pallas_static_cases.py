"""Adversarial Pallas candidates that the static check must refuse, each with its exact reason code.

Every case targets `pallas_cases.TASK_SOURCE` (ReLU over a vector, input `x`), keeps a working kernel
beside the attack where it can, and is caught at stage "static" with status "compile_error". They
cover the ways around the old deny-lists: attributes looked up by name (`match` class patterns,
`str.format` fields, `getattr`, builtins dicts), names built from pieces, code and state at import,
stores into module-level objects, frames, and sources too large or too deeply nested to parse.
"""
from __future__ import annotations

from kernels_eval.hardening.pallas_cases import Case
from kernels_eval.hardening.pallas_cases import _HEAD
from kernels_eval.hardening.pallas_cases import _KERNEL
from kernels_eval.hardening.pallas_cases import _solution

_GOOD = _HEAD + _KERNEL + _solution()


def _body(body: str, head: str = "") -> str:
  """A candidate whose `solution` runs `body` (indented two spaces), after the kernel and `head`."""
  return _HEAD + head + _KERNEL + "\n\ndef solution(x):\n" + body


def _static(name: str, source: str, reason: str) -> Case:
  return Case(name, source, "compile_error", "static", reason)


CASES = (
    _static("match_class_pattern", _body(
        "  match solution:\n"
        "    case object(__globals__=g):\n"
        "      return g['jnp'].maximum(x, 0.0)\n"
        "  return x\n"), "forbidden_construct"),
    _static("format_attribute_access", _body(
        "  leak = '{0.__globals__}'.format(solution)\n"
        "  return jnp.maximum(x, 0.0)\n"), "format_string"),
    _static("format_index_access", _body(
        "  leak = '{0[__builtins__][open]}'.format(vars)\n"
        "  return jnp.maximum(x, 0.0)\n"), "format_string"),
    _static("format_map_environ", _body(
        "  leak = '{m.os.environ}'.format_map({'m': jnp})\n"
        "  return jnp.maximum(x, 0.0)\n"), "format_string"),
    _static("fstring_globals", _body(
        "  leak = f'{solution.__globals__}'\n"
        "  return jnp.maximum(x, 0.0)\n"), "dunder_access"),
    _static("fstring_environ", _body(
        "  leak = f'{jnp.os.environ}'\n"
        "  return jnp.maximum(x, 0.0)\n"), "forbidden_api"),
    _static("getattr_from_pieces", _body(
        "  cls = getattr(x, '_' + '_cla' + 'ss_' + '_')\n"
        "  return jnp.maximum(x, 0.0)\n"), "forbidden_builtin"),
    _static("dunder_string_from_pieces", _body(
        "  name = '__cla' 'ss__'\n"
        "  return jnp.maximum(x, 0.0)\n"), "dunder_access"),
    _static("decorator_runs_at_import", _HEAD + _KERNEL + '''

def _register(fn):
  return fn


@_register
def solution(x):
  return jnp.maximum(x, 0.0)
''', "decorator_at_import"),
    _static("lru_cache_decorator", "import functools\n" + _HEAD + _KERNEL + "\n\n@functools.lru_cache\n"
            + _solution().lstrip("\n"), "decorator_at_import"),
    _static("config_update_at_import", _HEAD + "jax.config.update('jax_enable_x64', True)\n" + _KERNEL + _solution(),
            "code_at_import"),
    _static("kernel_call_at_import", _HEAD + _KERNEL + _solution() + "\n\nWARM = solution(jnp.ones(256))\n",
            "code_at_import"),
    _static("functools_reduce", "import functools\n" + _body(
        "  return functools.reduce(lambda acc, f: f(acc), (lambda v: jnp.maximum(v, 0.0),), x)\n"),
            "forbidden_attribute"),
    _static("module_cache_store", _body(
        "  out = jnp.maximum(x, 0.0)\n"
        "  _CACHE[0] = out\n"
        "  return out\n", head="_CACHE = (None,)\n"), "mutable_global_state"),
    _static("module_dict_cache", _body(
        "  return jnp.maximum(x, 0.0)\n", head="_CACHE = dict()\n"), "code_at_import"),
    _static("lambda_default_state", _body(
        "  remember = lambda v, memo=[]: memo.append(v) or memo[0]\n"
        "  return remember(jnp.maximum(x, 0.0))\n"), "mutable_global_state"),
    _static("generator_frame", _body(
        "  frame = (i for i in ()).gi_frame\n"
        "  return jnp.maximum(x, 0.0)\n"), "forbidden_api"),
    _static("deeply_nested_expression", _body("  return " + "-" * 30000 + "x\n"), "too_deeply_nested"),
    _static("deeply_nested_brackets", _body("  return " + "(" * 150 + "x" + ")" * 150 + "\n"),
            "too_deeply_nested"),
    _static("huge_source", _GOOD + "#" * (70 << 10) + "\n", "source_too_large"),
    _static("type_builtin", _body(
        "  cls = type(x)\n"
        "  return jnp.maximum(x, 0.0)\n"), "forbidden_builtin"),
    _static("object_builtin", _body(
        "  kinds = object\n"
        "  return jnp.maximum(x, 0.0)\n"), "forbidden_builtin"),
    _static("super_builtin", _body(
        "  parent = super()\n"
        "  return jnp.maximum(x, 0.0)\n"), "forbidden_builtin"),
    _static("builtins_dict_getattr", _body(
        "  get = __builtins__['getattr']\n"
        "  return jnp.maximum(x, 0.0)\n"), "dunder_access"),
    _static("vars_call", _body(
        "  names = vars(jnp)\n"
        "  return jnp.maximum(x, 0.0)\n"), "forbidden_builtin"),
    _static("globals_call", _body(
        "  names = globals()\n"
        "  return jnp.maximum(x, 0.0)\n"), "forbidden_builtin"),
    _static("breakpoint_call", _body(
        "  breakpoint()\n"
        "  return jnp.maximum(x, 0.0)\n"), "forbidden_builtin"),
    _static("help_call", _body(
        "  help(jax)\n"
        "  return jnp.maximum(x, 0.0)\n"), "forbidden_builtin"),
    _static("print_leak", _body(
        "  print(x)\n"
        "  return jnp.maximum(x, 0.0)\n"), "forbidden_builtin"),
    _static("exec_via_compile", _body(
        "  exec(compile('import os', 'k', 'exec'))\n"
        "  return jnp.maximum(x, 0.0)\n"), "forbidden_builtin"),
    _static("try_except_probe", _body(
        "  try:\n"
        "    pl.pallas_call.cache_clear()\n"
        "  except AttributeError:\n"
        "    pass\n"
        "  return jnp.maximum(x, 0.0)\n"), "forbidden_construct"),
    _static("with_statement", _body(
        "  with jax.named_scope('relu'):\n"
        "    return jnp.maximum(x, 0.0)\n"), "forbidden_construct"),
    _static("walrus_leak", _body(
        "  ys = [(last := v) for v in (x,)]\n"
        "  return jnp.maximum(x, 0.0)\n"), "forbidden_construct"),
    _static("jnp_load_file", _body(
        "  table = jnp.load('/proc/self/environ')\n"
        "  return jnp.maximum(x, 0.0)\n"), "forbidden_attribute"),
    _static("module_alias_value", _body(
        "  np_ = jnp\n"
        "  return np_.maximum(x, 0.0)\n"), "module_as_value"),
    _static("rebind_module_alias", _HEAD + _KERNEL + _solution() + "\n\njnp = pl\n", "shadowed_import"),
    _static("comprehension_scope_builtin", _body(
        "  files = [open for open in open]\n"
        "  return jnp.maximum(x, 0.0)\n"), "forbidden_builtin"),
    _static("interpret_via_dict", _GOOD.replace("(i,)))(x)", "(i,)), **{'interpret': True})(x)"),
            "harness_option"),
)
