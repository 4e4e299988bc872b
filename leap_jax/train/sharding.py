"""Shardings for the learner: batch over ("data", "fsdp"), parameters by spec, optimizer state alike.

The mesh itself comes from `leap_jax.models.sharding.make_mesh` (re-exported here).
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from leap_jax.models import sharding as model_sharding

BATCH_AXES = model_sharding.BATCH_AXES
make_mesh = model_sharding.make_mesh


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (episode) axis split over ("data", "fsdp"), the rest replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def shard_batch(batch: Any, mesh: Mesh) -> Any:
  """Host arrays -> global jax Arrays sharded by `batch_sharding`.

  With several processes each passes its own contiguous block of rows (process i holds rows
  [i * B / n, (i + 1) * B / n) of the global batch). None leaves stay None.
  """
  sharding = batch_sharding(mesh)
  num_shards = mesh.shape["data"] * mesh.shape["fsdp"]

  def put(x):
    global_rows = x.shape[0] * jax.process_count()
    if global_rows % num_shards:
      raise ValueError(f"global batch of {global_rows} episodes does not split over {num_shards} data shards")
    global_shape = (global_rows,) + tuple(x.shape[1:])
    return jax.make_array_from_process_local_data(sharding, np.asarray(x), global_shape)

  return jax.tree.map(put, batch)


def param_shardings(params: Any, mesh: Mesh, param_specs: Any = None) -> Any:
  """NamedShardings for `params`; `param_specs` is a matching pytree of PartitionSpecs (None: replicate)."""
  if param_specs is None:
    return jax.tree.map(lambda _: NamedSharding(mesh, P()), params)
  return jax.tree.map(lambda _, spec: NamedSharding(mesh, spec), params, param_specs)


def opt_state_shardings(optimizer: optax.GradientTransformation, opt_state: Any, mesh: Mesh,
                        param_sharding: Any) -> Any:
  """Optimizer-state shardings: moment trees follow the parameters, counters are replicated."""
  return optax.tree_map_params(
      optimizer, lambda _, s: s, opt_state, param_sharding,
      transform_non_params=lambda _: NamedSharding(mesh, P()),
      is_leaf=lambda x: isinstance(x, NamedSharding))
