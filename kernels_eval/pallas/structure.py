"""Structural check of a candidate's jaxpr: the answer must be computed by `pallas_call` kernels.

Call-like equations (`jit`, `closed_call`, `custom_jvp_call`, ...) are inlined into one dataflow graph.
With `deps` = everything the output depends on:
  - every `pallas_call` must be in `deps`            (else `decoy_kernel`: a kernel whose result is unused),
  - the output must come from a `pallas_call` output through at most OUTPUT_OPS (reshape/slice/cast)
                                                     (else `output_not_from_kernel`),
  - every other equation in `deps` must be data movement (INPUT_OPS: reshape, pad, broadcast, cast, ...)
                                                     (else `compute_outside_kernel`: a jnp fallback).
Kernel bodies (the `pallas_call` params) are not inspected: inside a kernel anything goes.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from jax.extend import core as jex_core

CALL_PRIMITIVES = frozenset({"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
                             "custom_vjp_call_jaxpr", "remat", "checkpoint", "custom_lin"})
OUTPUT_OPS = frozenset({"reshape", "squeeze", "expand_dims", "slice", "convert_element_type", "copy", "copy_p"})
INPUT_OPS = OUTPUT_OPS | frozenset({"broadcast_in_dim", "pad", "iota"})
SUB_JAXPR_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


@dataclasses.dataclass
class _Node:
  kind: str            # "input", "const" or a primitive name
  inputs: list[int]


class _Graph:
  def __init__(self):
    self.nodes: list[_Node] = []
    self.values: list[int] = []   # value id -> producing node index

  def add(self, kind: str, inputs: list[int], n_out: int) -> list[int]:
    self.nodes.append(_Node(kind, inputs))
    node = len(self.nodes) - 1
    first = len(self.values)
    self.values.extend([node] * n_out)
    return list(range(first, first + n_out))


def _sub_jaxpr(eqn) -> Any | None:
  for name in SUB_JAXPR_PARAMS:
    sub = eqn.params.get(name)
    if sub is not None and hasattr(sub, "jaxpr") and hasattr(sub, "consts"):
      return sub.jaxpr
    if sub is not None and hasattr(sub, "eqns"):
      return sub
  return None


def _flatten(graph: _Graph, jaxpr, in_ids: list[int]) -> list[int]:
  env: dict[Any, int] = {}
  for v in jaxpr.constvars:
    env[v] = graph.add("const", [], 1)[0]
  for v, i in zip(jaxpr.invars, in_ids):
    env[v] = i

  def read(v) -> int:
    if isinstance(v, jex_core.Literal):
      return graph.add("const", [], 1)[0]
    return env[v]

  for eqn in jaxpr.eqns:
    ins = [read(v) for v in eqn.invars]
    sub = _sub_jaxpr(eqn) if eqn.primitive.name in CALL_PRIMITIVES else None
    if sub is not None and len(sub.invars) == len(ins):
      outs = _flatten(graph, sub, ins)
    else:
      outs = graph.add(eqn.primitive.name, ins, len(eqn.outvars))
    for v, o in zip(eqn.outvars, outs):
      env[v] = o
  return [read(v) for v in jaxpr.outvars]


def check_jaxpr(closed_jaxpr) -> tuple[str, str] | None:
  """Returns (reason, message) when the structure is not acceptable, else None."""
  jaxpr = closed_jaxpr.jaxpr
  graph = _Graph()
  in_ids = [graph.add("input", [], 1)[0] for _ in jaxpr.invars]
  outs = _flatten(graph, jaxpr, in_ids)
  if len(outs) != 1:
    return "bad_output", f"`solution` must return exactly one array (it returns {len(outs)})"
  kernels = [i for i, n in enumerate(graph.nodes) if n.kind == "pallas_call"]
  if not kernels:
    return "no_pallas_call", "`solution` never calls `pl.pallas_call`: the result must come from a kernel"
  deps: set[int] = set()
  stack = [graph.values[outs[0]]]
  while stack:
    node = stack.pop()
    if node in deps:
      continue
    deps.add(node)
    stack.extend(graph.values[v] for v in graph.nodes[node].inputs)
  unused = [k for k in kernels if k not in deps]
  if unused:
    return "decoy_kernel", (f"{len(unused)} of {len(kernels)} pallas_call results are never used: the output "
                            "must be computed by the kernels you launch")
  node = graph.values[outs[0]]
  while graph.nodes[node].kind in OUTPUT_OPS:
    node = graph.values[graph.nodes[node].inputs[0]]
  if graph.nodes[node].kind != "pallas_call":
    return "output_not_from_kernel", (f"the returned array comes from `{graph.nodes[node].kind}`, not from a "
                                      "pallas_call (only reshapes/slices/casts may follow the kernel)")
  outside = sorted({graph.nodes[n].kind for n in deps} - INPUT_OPS - {"pallas_call", "input", "const"})
  if outside:
    return "compute_outside_kernel", (f"computation outside the kernel ({', '.join(outside)}): do the work "
                                      "inside pallas_call; outside it only reshape/slice/pad/cast inputs")
  return None
