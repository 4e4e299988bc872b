"""The oracle table for the Pallas path: broken or adversarial candidates and their expected verdicts.

All cases target `TASK_SOURCE` (ReLU over a 1-D float32 vector; check sizes 1000 and 256). Each case
gives the expected `(status, stage)` and either the `rejected_reason` or a flag that must be present.
`timeout_s`, when set, is the wall limit to evaluate that case with.
"""
from __future__ import annotations

import dataclasses

TASK_SOURCE = '''"""ReLU over a vector (hardening target)."""
import jax
import jax.numpy as jnp

ID = "hardening_relu"
LEVEL = 1
SPLIT = "train"
FAMILY = "elementwise"
STATEMENT = "Compute out[i] = max(x[i], 0)."
DIMS = {"check": [{"N": 1000}, {"N": 256}], "timing": {"N": 1048576}}
INPUTS = [{"name": "x", "shape": ["N"], "dtype": "float32", "dist": {"kind": "normal"}}]


def reference(x):
  return jnp.maximum(x, 0.0)
'''

_HEAD = '''import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

BLOCK = 256
'''

_KERNEL = '''

def _relu_kernel(x_ref, o_ref):
  o_ref[...] = jnp.maximum(x_ref[...], 0.0)
'''


def _solution(block: str = "BLOCK", grid: str = "pl.cdiv(n, BLOCK)", index: str = "(i,)", kernel: str = "_relu_kernel",
              out_shape: str = "x.shape", tail: str = "") -> str:
  return f'''

def solution(x):
  n = x.shape[0]
  out = pl.pallas_call({kernel}, out_shape=jax.ShapeDtypeStruct({out_shape}, x.dtype), grid=({grid},),
                       in_specs=[pl.BlockSpec(({block},), lambda i: {index})],
                       out_specs=pl.BlockSpec(({block},), lambda i: (i,)))(x)
  return out{tail}
'''


GOOD = _HEAD + _KERNEL + _solution()


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  source: str
  status: str
  stage: str
  rejected_reason: str | None = None
  flag: str | None = None
  timeout_s: float | None = None


CASES = (
    Case("correct_baseline", GOOD, "correct", "correctness"),
    Case("syntax_error", _HEAD + "\ndef solution(x)\n  return x\n", "compile_error", "static", "syntax_error"),
    Case("wrong_index", _HEAD + _KERNEL + _solution(index="(0,)"), "wrong_output", "correctness"),
    Case("off_by_one_tile", _HEAD + _KERNEL + _solution(grid="n // BLOCK"), "wrong_output", "correctness"),
    Case("zeros_output", _HEAD + '''

def _zero_kernel(x_ref, o_ref):
  o_ref[...] = jnp.zeros_like(x_ref[...])
''' + _solution(kernel="_zero_kernel"), "wrong_output", "correctness"),
    Case("infinite_loop", _HEAD + '''

def _loop_kernel(x_ref, o_ref):
  c = lax.while_loop(lambda c: c < 1.0, lambda c: c * 0.0, jnp.float32(0.0))
  o_ref[...] = jnp.maximum(x_ref[...], 0.0) + c
''' + _solution(kernel="_loop_kernel"), "timeout", "correctness", timeout_s=15.0),
    Case("oversized_output", _HEAD + _KERNEL + _solution(out_shape="(1 << 21,)"), "runtime_error", "correctness",
         "output_limit"),
    Case("huge_allocation", _HEAD + _KERNEL + _solution(out_shape="(1 << 32,)", tail="[:n]"), "runtime_error",
         "correctness"),
    Case("fork_bomb", "import os\n\n\ndef solution(x):\n  while True:\n    os.fork()\n", "compile_error", "static",
         "forbidden_import"),
    Case("forbidden_import", "import numpy as np\n" + _HEAD + _KERNEL + _solution(), "compile_error", "static",
         "forbidden_import"),
    Case("file_write", _HEAD + _KERNEL + "\n\ndef solution(x):\n  open('sentinel.txt', 'w').write('x')\n  return x\n",
         "compile_error", "static", "forbidden_builtin"),
    Case("network_attempt", "import socket\n" + _HEAD + _KERNEL + _solution(), "compile_error", "static",
         "network_access"),
    Case("dunder_escape", _HEAD + _KERNEL + "\n\ndef solution(x):\n  return x.__class__.__init__.__globals__\n",
         "compile_error", "static", "dunder_access"),
    Case("getattr_trick", _HEAD + _KERNEL + "\n\ndef solution(x):\n  return getattr(jnp, 'maximum')(x, 0.0)\n",
         "compile_error", "static", "forbidden_builtin"),
    Case("host_callback", _HEAD + _KERNEL + "\n\ndef solution(x):\n  return jax.pure_callback(abs, x, x)\n",
         "compile_error", "static", "forbidden_api"),
    Case("module_result_cache", _HEAD + "_CACHE = {}\n" + _KERNEL + '''

def solution(x):
  if "out" not in _CACHE:
    _CACHE["out"] = pl.pallas_call(_relu_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
  return _CACHE["out"]
''', "compile_error", "static", "mutable_global_state"),
    Case("function_attribute_cache", _HEAD + _KERNEL + _solution() + "\n\nsolution.memo = None\n",
         "compile_error", "static", "mutable_global_state"),
    Case("harness_option", _HEAD + _KERNEL + _solution().replace("(i,)))(x)", "(i,)), interpret=True)(x)"),
         "compile_error", "static", "harness_option"),
    Case("missing_solution", _HEAD + _KERNEL, "compile_error", "static", "missing_solution"),
    Case("decoy_kernel", _HEAD + _KERNEL + '''

def solution(x):
  pl.pallas_call(_relu_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(pl.cdiv(x.shape[0], BLOCK),),
                 in_specs=[pl.BlockSpec((BLOCK,), lambda i: (i,))],
                 out_specs=pl.BlockSpec((BLOCK,), lambda i: (i,)))(x)
  return jnp.maximum(x, 0.0)
''', "compile_error", "compile", "decoy_kernel"),
    Case("jnp_fallback", _HEAD + '''

def _copy_kernel(x_ref, o_ref):
  o_ref[...] = x_ref[...]
''' + _solution(kernel="_copy_kernel").replace("  n = x.shape[0]\n", "  n = x.shape[0]\n  x = jnp.maximum(x, 0.0)\n"),
         "compile_error", "compile", "compute_outside_kernel"),
    Case("no_kernel", _HEAD + "\n\ndef solution(x):\n  return jnp.maximum(x, 0.0)\n", "compile_error", "compile",
         "no_pallas_call"),
    Case("triton_illegal_block", _HEAD.replace("BLOCK = 256", "BLOCK = 100") + _KERNEL + _solution(),
         "compile_error", "lower"),
    Case("saturating_cast_outside_kernel", _HEAD + '''

def _scale_kernel(x_ref, o_ref):
  o_ref[...] = x_ref[...] * 65536.0


def _unscale_kernel(x_ref, o_ref):
  o_ref[...] = x_ref[...] / 65536.0
''' + _solution(kernel="_scale_kernel").replace("  return out\n", "  out = out.astype(jnp.uint32).astype(jnp.float32)\n"
    "  return pl.pallas_call(_unscale_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(out)\n"),
         "compile_error", "compile", "compute_outside_kernel"),
    Case("constant_state_operand", _HEAD + '''

def _flag_kernel(x_ref, f_ref, o_ref):
  o_ref[...] = jnp.maximum(x_ref[...], 0.0) + 0.0 * f_ref[0]
  f_ref[0] = 1.0


def solution(x):
  flags = jnp.zeros((8,), jnp.float32)
  return pl.pallas_call(_flag_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, flags)
''', "compile_error", "compile", "constant_kernel_operand"),
)

SCALAR_TASK_SOURCE = '''"""Sum of a vector: a 0-d output, as every loss has (hardening target)."""
import jax
import jax.numpy as jnp

ID = "hardening_sum"
LEVEL = 1
SPLIT = "train"
FAMILY = "reduction"
STATEMENT = "Compute out = sum_i x[i] (a scalar)."
DIMS = {"check": [{"N": 1000}, {"N": 256}], "timing": {"N": 65536}}
INPUTS = [{"name": "x", "shape": ["N"], "dtype": "float32", "dist": {"kind": "normal"}}]


def reference(x):
  return jnp.sum(x)
'''

_SCALAR = "import functools\n" + _HEAD + '''from jax.experimental.pallas import triton as plt


def _sum_kernel(x_ref, o_ref, *, n):
  mask = jnp.arange(x_ref.shape[0]) < n
  o_ref[...] = jnp.sum(plt.load(x_ref, mask=mask, other=0.0) * SCALE, keepdims=True)


def solution(x):
  n = x.shape[0]
  return pl.pallas_call(functools.partial(_sum_kernel, n=n), out_shape=jax.ShapeDtypeStruct((1,), x.dtype),
                        grid=(1,), in_specs=[pl.BlockSpec((pl.next_power_of_2(n),), lambda i: (0,))],
                        out_specs=pl.BlockSpec((1,), lambda i: (0,)))(x).reshape(())
'''

# Cases on SCALAR_TASK_SOURCE: a wrong answer to a 0-d output is `wrong_output`, never an evaluator error.
SCALAR_CASES = (
    Case("scalar_output_correct", _SCALAR.replace("SCALE", "1.0"), "correct", "correctness"),
    Case("scalar_output_wrong", _SCALAR.replace("SCALE", "2.0"), "wrong_output", "correctness"),
)
