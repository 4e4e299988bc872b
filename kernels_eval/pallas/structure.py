"""Structural check of a candidate's jaxpr: the answer must be computed by `pallas_call` kernels.

Every equation anywhere in the jaxpr (outside kernels, inside kernel bodies and their index maps, inside
loops and calls) must be a primitive of `ALLOWED_PRIMITIVES` (else `forbidden_primitive`): pure array
math, data movement, control flow, the Pallas memory and program-id primitives. Host callbacks, debug
printing, inline assembly, collectives, platform-dependent branches and library calls (linear algebra,
FFT) are not in it, so nothing a checked jaxpr does can reach the host or tell the platforms apart.

Call-like equations (`jit`, `closed_call`, `custom_jvp_call`, ...) are inlined into one dataflow graph.
With `deps` = everything the output depends on:
  - every `pallas_call` must be in `deps`            (else `decoy_kernel`: a kernel whose result is unused),
  - the output must come from a `pallas_call` output through at most OUTPUT_OPS (reshape/slice/cast)
                                                     (else `output_not_from_kernel`),
  - every other equation in `deps` must be data movement (INPUT_OPS: reshape, pad, broadcast, float casts, ...)
                                                     (else `compute_outside_kernel`: a jnp fallback),
  - every pallas_call operand must depend on an input of `solution` (else `constant_kernel_operand`: a
    constant's buffer lives as long as the compiled program, so a kernel writing it keeps state across calls).
Kernel bodies (the `pallas_call` params) are not inspected: inside a kernel anything goes.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
from jax.extend import core as jex_core

ALLOWED_PRIMITIVES = frozenset({
    # element-wise math and comparisons
    "abs", "acos", "acosh", "add", "and", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "ceil", "clamp", "clz",
    "cos", "cosh", "div", "eq", "erf", "erf_inv", "erfc", "exp", "exp2", "expm1", "floor", "ge", "gt",
    "integer_pow", "is_finite", "le", "lgamma", "digamma", "log", "log1p", "logistic", "lt", "max", "min", "mul",
    "ne", "neg", "nextafter", "not", "or", "population_count", "pow", "reciprocal", "rem", "round", "rsqrt",
    "select_n", "shift_left", "shift_right_arithmetic", "shift_right_logical", "sign", "sin", "sinh", "sqrt",
    "square", "sub", "tan", "tanh", "xor", "convert_element_type", "bitcast_convert_type", "reduce_precision",
    "copy", "copy_p", "stop_gradient",
    # shapes, data movement and reductions
    "broadcast_in_dim", "concatenate", "dynamic_slice", "dynamic_update_slice", "expand_dims", "iota", "pad",
    "reshape", "rev", "slice", "squeeze", "transpose", "split", "gather", "argmax", "argmin", "reduce_and",
    "reduce_max", "reduce_min", "reduce_or", "reduce_prod", "reduce_sum", "reduce_xor", "sort", "top_k",
    "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "dot_general", "empty", "optimization_barrier",
    # control flow and calls (their bodies are checked too)
    "cond", "while", "scan", "jit", "pjit", "closed_call", "core_call", "remat", "checkpoint",
    "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
    # pseudo-random bits (jax.random inside or around kernels)
    "random_bits", "random_seed", "random_wrap", "random_unwrap", "threefry2x32", "rng_bit_generator",
    # Pallas: kernels, refs, program ids, atomics
    "pallas_call", "get", "swap", "addupdate", "masked_load", "masked_swap", "program_id", "num_programs",
    "multiple_of", "max_contiguous", "atomic_rmw", "atomic_cas", "run_scoped",
})
CALL_PRIMITIVES = frozenset({"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
                             "custom_vjp_call_jaxpr", "remat", "checkpoint", "custom_lin"})
OUTPUT_OPS = frozenset({"reshape", "squeeze", "expand_dims", "slice", "convert_element_type", "copy", "copy_p"})
INPUT_OPS = OUTPUT_OPS | frozenset({"broadcast_in_dim", "pad", "iota"})
INT_FLOAT_CAST = "convert_element_type (between integer and float)"
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
      outs = graph.add(_kind(eqn), ins, len(eqn.outvars))
    for v, o in zip(eqn.outvars, outs):
      env[v] = o
  return [read(v) for v in jaxpr.outvars]


def _kind(eqn) -> str:
  """The primitive's name; a cast that is not float to float gets its own name (`INT_FLOAT_CAST`): applied
  to data it computes (uint32 of a float is a ReLU), applied to constants it does not."""
  name = eqn.primitive.name
  if name == "convert_element_type":
    src, dst = eqn.invars[0].aval.dtype, eqn.params["new_dtype"]
    if src != dst and not (jnp.issubdtype(src, jnp.floating) and jnp.issubdtype(dst, jnp.floating)):
      return INT_FLOAT_CAST
  return name


def _reaches_input(graph: _Graph, node: int) -> bool:
  """Whether `node` depends on an input of `solution` (else it is computed from constants alone)."""
  stack, seen = [node], set()
  while stack:
    n = stack.pop()
    if graph.nodes[n].kind == "input":
      return True
    if n not in seen:
      seen.add(n)
      stack.extend(graph.values[v] for v in graph.nodes[n].inputs)
  return False


def _from_inputs_only(graph: _Graph, kernel: int) -> bool:
  """Every operand of the kernel node depends on a `solution` input: a constant operand would be a buffer
  that lives as long as the compiled program, where a kernel could keep state from call to call."""
  return all(_reaches_input(graph, graph.values[v]) for v in graph.nodes[kernel].inputs)


def _sub_jaxprs(eqn) -> list[Any]:
  """Every jaxpr held in an equation's params: call and loop bodies, kernel bodies, index maps."""
  found = []
  for value in eqn.params.values():
    for item in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(item, jex_core.ClosedJaxpr):
        found.append(item.jaxpr)
      elif isinstance(item, jex_core.Jaxpr):
        found.append(item)
  grid = eqn.params.get("grid_mapping")
  for block in getattr(grid, "block_mappings", ()):
    found.append(block.index_map_jaxpr.jaxpr)
  return found


def forbidden_primitive(jaxpr, in_kernel: bool = False) -> str | None:
  """The first primitive outside `ALLOWED_PRIMITIVES` anywhere in `jaxpr` (a pallas_call inside a kernel
  counts as one), or None."""
  stack = [(jaxpr, in_kernel)]
  while stack:
    current, kernel = stack.pop()
    for eqn in current.eqns:
      name = eqn.primitive.name
      if name not in ALLOWED_PRIMITIVES or (kernel and name == "pallas_call"):
        return name
      stack.extend((sub, kernel or name == "pallas_call") for sub in _sub_jaxprs(eqn))
  return None


def interpreted(closed_jaxpr):
  """The same computation with every pallas_call run by the Pallas interpreter (CPU execution)."""
  def rewrite(jaxpr):
    eqns = []
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "pallas_call":
        eqn = eqn.replace(params={**eqn.params, "interpret": True})
      elif eqn.primitive.name in CALL_PRIMITIVES | {"cond", "while", "scan"}:
        eqn = eqn.replace(params={k: _map_jaxprs(v, rewrite) for k, v in eqn.params.items()})
      eqns.append(eqn)
    return jaxpr.replace(eqns=eqns)
  return jex_core.ClosedJaxpr(rewrite(closed_jaxpr.jaxpr), closed_jaxpr.consts)


def _map_jaxprs(value: Any, fn) -> Any:
  if isinstance(value, jex_core.ClosedJaxpr):
    return jex_core.ClosedJaxpr(fn(value.jaxpr), value.consts)
  if isinstance(value, jex_core.Jaxpr):
    return fn(value)
  if isinstance(value, tuple):
    return tuple(_map_jaxprs(v, fn) for v in value)
  return value


def check_jaxpr(closed_jaxpr) -> tuple[str, str] | None:
  """Returns (reason, message) when the structure is not acceptable, else None."""
  jaxpr = closed_jaxpr.jaxpr
  bad = forbidden_primitive(jaxpr)
  if bad is not None:
    return "forbidden_primitive", (f"`{bad}` is not allowed in kernel code (allowed: array math, data movement, "
                                   "control flow and the Pallas primitives; no callbacks, debug printing, inline "
                                   "assembly, collectives, platform-dependent code or library calls)")
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
  if not all(_from_inputs_only(graph, k) for k in kernels):
    return "constant_kernel_operand", ("a pallas_call operand is a constant (it depends on no input of `solution`): "
                                       "its buffer would outlive the call; compute it inside the kernel instead")
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
  outside = sorted({graph.nodes[n].kind for n in deps if not (graph.nodes[n].kind == INT_FLOAT_CAST and
                                                           not _reaches_input(graph, n))}
                   - INPUT_OPS - {"pallas_call", "input", "const"})
  if outside:
    return "compute_outside_kernel", (f"computation outside the kernel ({', '.join(outside)}): do the work "
                                      "inside pallas_call; outside it only reshape/slice/pad/cast inputs")
  return None
