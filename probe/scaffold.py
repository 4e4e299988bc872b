"""Skeletons of generated level-0 tasks: the harness writes the kernel scaffold, the generator only the task.

A level-0 task asks the solver for the line(s) that replace the marker of a Pallas skeleton. The generator
writes the task's statement, INPUTS, DIMS and `reference`; the harness picks the suite's scaffold for the
task's shape signature and proves it completable before the task counts as valid:

  elementwise    every input has one 2-D shape [A, B] and the output has it too (2-D grid of 32 x 128
                 blocks, inputs loaded masked with 0.0, output stored masked);
  row reduction  one 2-D input [A, B] and output shape (A,) (8 whole rows per block; masked columns load
                 the identity of the reference's outermost reduction: +inf for min, -inf for max, 1 for
                 prod, else 0).

The witness is the reference's own body with `return E` turned into `out = E`. A scaffold is kept only if
the evaluator judges the witness-completed skeleton correct, so every valid level-0 task has a solution of
the kind the solver is asked for. Both scaffolds are, line for line, those of the suite's level-0 tasks.
"""
from __future__ import annotations

import ast
import textwrap
from typing import Sequence

from kernels_eval import static_check
from kernels_eval import task as task_lib

_HEADER = """
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

"""
_ELEMENTWISE = """
def kernel({refs}, o_ref, *, m, n):
  bm, bn = o_ref.shape
  rows = pl.program_id(0) * bm + jnp.arange(bm)
  cols = pl.program_id(1) * bn + jnp.arange(bn)
  mask = (rows[:, None] < m) & (cols[None, :] < n)
{loads}
  {marker}
  plt.store(o_ref, out, mask=mask)


def solution({args}):
  m, n = {first}.shape
  bm, bn = 32, 128
  spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
  return pl.pallas_call(
      functools.partial(kernel, m=m, n=n),
      out_shape=jax.ShapeDtypeStruct({first}.shape, {first}.dtype),
      grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
      in_specs={in_specs},
      out_specs=spec,
  )({args})
"""
_ROW_REDUCTION = """
def kernel({name}_ref, o_ref, *, m, n):
  bm, bn = {name}_ref.shape
  rows = pl.program_id(0) * bm + jnp.arange(bm)
  cols = jnp.arange(bn)
  mask = (rows[:, None] < m) & (cols[None, :] < n)
  {name} = plt.load({name}_ref, mask=mask, other={other})
  {marker}
  plt.store(o_ref, out, mask=rows < m)


def solution({name}):
  m, n = {name}.shape
  bm, bn = 8, pl.next_power_of_2(n)
  return pl.pallas_call(
      functools.partial(kernel, m=m, n=n),
      out_shape=jax.ShapeDtypeStruct((m,), {name}.dtype),
      grid=(pl.cdiv(m, bm),),
      in_specs=[pl.BlockSpec((bm, bn), lambda i: (i, 0))],
      out_specs=pl.BlockSpec((bm,), lambda i: (i,)),
  )({name})
"""
_IDENTITY = {"min": "jnp.inf", "amin": "jnp.inf", "nanmin": "jnp.inf", "max": "-jnp.inf", "amax": "-jnp.inf",
             "nanmax": "-jnp.inf", "prod": "1.0"}


_SCAFFOLD_NAMES = frozenset({"functools", "jax", "jnp", "pl", "plt", "kernel", "solution", "o_ref", "m", "n",
                             "bm", "bn", "rows", "cols", "mask", "out", "spec"})


class NoScaffold(ValueError):
  """The task's shape signature or reference has no level-0 scaffold; the message says why."""


def witness(reference_source: str) -> str:
  """The reference's body as marker lines: its statements, with the final `return E` as `out = E`.

  Raises NoScaffold when the body does not end in its only `return E`.
  """
  fn = static_check.parse_python(textwrap.dedent(reference_source)).body[0]
  body = list(fn.body)
  if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
    body = body[1:]
  if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
    raise NoScaffold("reference does not end in `return <expression>`")
  if any(isinstance(n, ast.Return) for stmt in body[:-1] for n in ast.walk(stmt)):
    raise NoScaffold("reference returns before its last statement")
  lines = [ast.unparse(stmt) for stmt in body[:-1]]
  return "\n".join(lines + [f"out = {ast.unparse(body[-1].value)}"]) + "\n"


def _reduction_identity(reference_source: str) -> str:
  fn = static_check.parse_python(textwrap.dedent(reference_source)).body[0]
  value = fn.body[-1].value if fn.body and isinstance(fn.body[-1], ast.Return) else None
  if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
    return _IDENTITY.get(value.func.attr, "0.0")
  return "0.0"


def skeleton(task: task_lib.Task, output_shape: Sequence[int]) -> str:
  """The Pallas skeleton for `task`, whose reference output at its first check dims has `output_shape`.

  Raises NoScaffold naming the shape signature when neither scaffold fits, or the input names that clash with
  the scaffold's own (`m`, `n`, `mask`, ...).
  """
  clashes = sorted({i.name for i in task.inputs} & _SCAFFOLD_NAMES)
  if clashes:
    raise NoScaffold(f"input name(s) {clashes} clash with the scaffold's own names {sorted(_SCAFFOLD_NAMES)}")
  shapes = [tuple(i.shape) for i in task.inputs]
  first = task.inputs[0].concrete_shape(task.check_dims[0])
  output_shape = tuple(output_shape)
  marker = task_lib.SKELETON_MARKER
  if len(shapes[0]) == 2 and len(set(shapes)) == 1 and output_shape == tuple(first):
    names = [i.name for i in task.inputs]
    body = _ELEMENTWISE.format(
        refs=", ".join(f"{n}_ref" for n in names), args=", ".join(names), first=names[0], marker=marker,
        loads="\n".join(f"  {n} = plt.load({n}_ref, mask=mask, other=0.0)" for n in names),
        in_specs="[spec]" if len(names) == 1 else f"[spec] * {len(names)}")
  elif len(shapes) == 1 and len(shapes[0]) == 2 and output_shape == (first[0],):
    body = _ROW_REDUCTION.format(name=task.inputs[0].name, marker=marker,
                                 other=_reduction_identity(task.reference_source))
  else:
    signature = ", ".join(f"{i.name}{list(i.shape)}" for i in task.inputs)
    raise NoScaffold(f"no level-0 scaffold for inputs {signature} -> output of shape {list(output_shape)} "
                     "(elementwise over one 2-D shape, or a row reduction of one 2-D input)")
  return _HEADER + body


def with_skeleton(text: str, pallas_skeleton: str) -> str:
  """Task file text with `SKELETON = {"pallas": ...}` in place of any SKELETON it had (appended at the end)."""
  kept = task_lib.drop_assignments(text, ("SKELETON",)).rstrip() + "\n"
  return f'{kept}\n\nSKELETON = {{\n    "pallas": """{pallas_skeleton}""",\n}}\n'
