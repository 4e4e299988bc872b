"""Flat, per-layer view of the decoder's params, independent of layer stacking.

Names are dotted paths with one entry per layer, e.g. "embedding", "layers.3.attn.q_proj",
"layers.3.mlp_norm.scale", "final_norm.scale", "lm_head". Weight loaders fill this view and
`model_from_flat` builds a model (scanned or not, optionally sharded) from it without random init.
"""
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from leap_jax.models.config import ModelConfig
from leap_jax.models.sharding import partition_specs
from leap_jax.models.transformer import Transformer


def _path_name(path) -> str:
  return ".".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path
                  if getattr(k, "name", None) != "value")


def _slots(cfg: ModelConfig, state: nnx.State) -> list[tuple[str, object, list[str] | None]]:
  """(state path name, leaf, per-layer flat names if the leaf is stacked) for every param."""
  slots = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    name = _path_name(path)
    if cfg.scan_layers and name.startswith("layers."):
      rest = name[len("layers."):]
      slots.append((name, leaf, [f"layers.{i}.{rest}" for i in range(cfg.num_layers)]))
    else:
      slots.append((name, leaf, None))
  return slots


def model_to_flat(model: Transformer) -> dict[str, jax.Array]:
  """{flat name: array} with stacked layer params split per layer."""
  state = nnx.state(model, nnx.Param)
  flat = {}
  for name, leaf, per_layer in _slots(model.config, state):
    if per_layer is None:
      flat[name] = leaf
    else:
      flat.update({n: leaf[i] for i, n in enumerate(per_layer)})
  return flat


def _abstract(cfg: ModelConfig):
  return nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))


def _shapes(cfg: ModelConfig, abstract: nnx.State) -> dict[str, tuple[int, ...]]:
  shapes = {}
  for name, leaf, per_layer in _slots(cfg, abstract):
    if per_layer is None:
      shapes[name] = tuple(leaf.shape)
    else:
      shapes.update({n: tuple(leaf.shape[1:]) for n in per_layer})
  return shapes


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
  """{flat name: shape} of every param of a model with this config."""
  return _shapes(cfg, _abstract(cfg)[1])


def _as_array(value, stack: list | None, dtype) -> jax.Array:
  """One param as a device array; `stack` (per-layer values) is stacked on the host when all numpy."""
  if stack is None:
    return jnp.asarray(value, dtype)
  if all(isinstance(v, np.ndarray) for v in stack):
    return jnp.asarray(np.stack(stack).astype(dtype, copy=False))
  return jnp.stack([jnp.asarray(v, dtype) for v in stack])


def model_from_flat(cfg: ModelConfig, flat: Mapping[str, np.ndarray | jax.Array],
                    mesh: Mesh | None = None) -> Transformer:
  """Builds a Transformer holding exactly `flat` (cast to cfg.param_dtype), sharded on `mesh` if given."""
  graphdef, abstract = _abstract(cfg)
  expected = _shapes(cfg, abstract)
  missing, extra = sorted(set(expected) - set(flat)), sorted(set(flat) - set(expected))
  if missing or extra:
    raise ValueError(f"param names do not match the config: missing {missing}, unexpected {extra}")
  for name, shape in expected.items():
    if tuple(flat[name].shape) != shape:
      raise ValueError(f"param {name} has shape {tuple(flat[name].shape)}, expected {shape}")
  slots = _slots(cfg, abstract)
  specs = [None] * len(slots)
  if mesh is not None:
    specs = jax.tree_util.tree_leaves(partition_specs(abstract, mesh), is_leaf=lambda x: isinstance(x, P))
  leaves = []
  for (name, _, per_layer), spec in zip(slots, specs):
    stack = None if per_layer is None else [flat[n] for n in per_layer]
    value = _as_array(flat.get(name), stack, cfg.weight_dtype)
    if spec is not None:
      value = jax.device_put(value, NamedSharding(mesh, spec))
    leaves.append(value)
  state = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(abstract), leaves)
  return nnx.merge(graphdef, state)
