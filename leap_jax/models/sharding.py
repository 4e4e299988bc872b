"""Sharding of the decoder over a ("data", "fsdp", "tensor") device mesh.

Weights are split over "fsdp" on the model-width side and over "tensor" on the heads / MLP / vocabulary
side (Megatron layout: column-parallel q/k/v/gate/up, row-parallel o/down). Stacked layer params get an
unsharded leading axis. A dimension that the mesh axis does not divide is left unsharded, so the same
rules serve tiny test models and large checkpoints. Batches are split over ("data", "fsdp").
"""
import jax
import numpy as np
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from leap_jax.models.config import ModelConfig

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Param name -> mesh axis of each (unstacked) dimension.
_RULES = {
    "embedding": ("tensor", "fsdp"),  # [V, D]
    "lm_head": ("fsdp", "tensor"),  # [D, V]
    "q_proj": ("fsdp", "tensor"),  # [D, H d]
    "k_proj": ("fsdp", "tensor"),  # [D, K d]
    "v_proj": ("fsdp", "tensor"),  # [D, K d]
    "o_proj": ("tensor", "fsdp"),  # [H d, D]
    "q_bias": ("tensor",),
    "k_bias": ("tensor",),
    "v_bias": ("tensor",),
    "o_bias": (None,),
    "gate_proj": ("fsdp", "tensor"),  # [D, F]
    "up_proj": ("fsdp", "tensor"),  # [D, F]
    "down_proj": ("tensor", "fsdp"),  # [F, D]
    "scale": (None,),
}


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices=None) -> Mesh:
  """Builds a ("data", "fsdp", "tensor") mesh; one size may be -1 (all remaining devices)."""
  devices = list(jax.devices() if devices is None else devices)
  sizes = [data, fsdp, tensor]
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"mesh sizes must be positive with at most one -1, got data={data} fsdp={fsdp} "
                     f"tensor={tensor}")
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"{len(devices)} devices are not divisible by data*tensor*fsdp sizes {sizes}")
    sizes[sizes.index(-1)] = len(devices) // known
  if int(np.prod(sizes)) != len(devices):
    raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {int(np.prod(sizes))} devices, "
                     f"have {len(devices)}")
  return Mesh(mesh_utils.create_device_mesh(tuple(sizes), devices), MESH_AXES)


def _names(path) -> list[str]:
  return [str(getattr(k, "key", getattr(k, "name", k))) for k in path]


def _fit(spec: tuple, shape: tuple[int, ...], mesh: Mesh | None) -> P:
  if mesh is not None:
    spec = tuple(a if a is None or shape[i] % mesh.shape[a] == 0 else None for i, a in enumerate(spec))
  return P(*spec)


def partition_specs(state: nnx.State, mesh: Mesh | None = None):
  """Maps `nnx.state(model)` (or any same-structured pytree of arrays) to PartitionSpecs.

  With `mesh`, axes that do not divide the dimension they would split are dropped.
  """
  def spec_for(path, leaf):
    names = [n for n in _names(path) if n in _RULES]
    if not names:
      raise ValueError(f"no sharding rule for parameter {'/'.join(_names(path))}")
    rule = _RULES[names[-1]]
    shape = tuple(leaf.shape)
    if len(shape) == len(rule) + 1:
      rule = (None,) + rule
    elif len(shape) != len(rule):
      raise ValueError(f"parameter {'/'.join(_names(path))} has shape {shape}, rule {rule}")
    return _fit(rule, shape, mesh)
  return jax.tree_util.tree_map_with_path(spec_for, state)


def shard_model(model: nnx.Module, mesh: Mesh) -> nnx.Module:
  """Places the model's params on `mesh` following `partition_specs`, in place; returns the model."""
  state = nnx.state(model)
  specs = partition_specs(state, mesh)
  shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))
  nnx.update(model, jax.device_put(state, shardings))
  return model


def batch_spec(mesh: Mesh, batch: int, ndim: int = 2) -> P:
  """[B, ...] arrays split over ("data", "fsdp") when those divide B, else replicated."""
  size = mesh.shape["data"] * mesh.shape["fsdp"]
  return P(BATCH_AXES if batch % size == 0 else None, *([None] * (ndim - 1)))


def cache_spec(cfg: ModelConfig, mesh: Mesh, batch: int) -> P:
  """Cache [N, B, K, S, d]: batch over ("data", "fsdp"), KV heads over "tensor" when divisible."""
  size = mesh.shape["data"] * mesh.shape["fsdp"]
  heads = "tensor" if cfg.num_kv_heads % mesh.shape["tensor"] == 0 else None
  return P(None, BATCH_AXES if batch % size == 0 else None, heads, None, None)
