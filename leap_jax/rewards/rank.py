"""Rank-based reward, LEAP (arXiv 2608.01804).

Samples are ordered by the turn of their first pass (turn 1 best, never passing worst) and
score a pairwise tournament against the valid peers of their group.
Shapes: P problems, G samples per group, T turns (index t=0 is turn 1).
"""
import jax
import jax.numpy as jnp

from leap_jax.rewards import _checks


def first_pass_turn(success, keep) -> jax.Array:
  """The level of each sample: the turn of its first kept pass.

    level[p,g] = min{t in 1..T : keep[p,g,t] ∧ s[p,g,t]},  T+1 when the set is empty

  LEAP, arXiv 2608.01804 (rank reward ordering).

  Args:
    success: bool[P,G,T], read only where kept.
    keep: bool[P,G,T], e.g. from `dcp_keep_mask`.

  Returns:
    int32[P,G] in 1..T+1.
  """
  fn = "first_pass_turn"
  success = _checks.array(success, "success", fn, 3, bool)
  keep = _checks.array(keep, "keep", fn, 3, bool)
  _checks.same_shape([success, keep], ["success", "keep"], fn, 3)
  hit = success & keep
  first = jnp.argmax(hit, axis=-1).astype(jnp.int32) + 1
  return jnp.where(jnp.any(hit, axis=-1), first, jnp.int32(success.shape[-1] + 1))


def rank_reward(level, valid=None) -> jax.Array:
  """Pairwise tournament inside each group; a lower level is better.

    r[p,i] = Σ_{j valid} (1[level_j > level_i] − 1[level_j < level_i]) / (n_valid[p] − 1)

  Equal levels count for neither side. Zero-sum over the valid samples of a group, values in
  [−1, 1]; invalid samples and groups with fewer than 2 valid samples get 0.
  LEAP, arXiv 2608.01804 (rank-based reward, used directly as the trajectory advantage).

  Args:
    level: int[P,G], e.g. from `first_pass_turn`.
    valid: optional bool[P,G]; default all True.

  Returns:
    float32[P,G].
  """
  fn = "rank_reward"
  level = _checks.array(level, "level", fn, 2, int)
  valid = _checks.valid_mask(valid, level.shape, fn)
  mine, peer = level[:, :, None], level[:, None, :]
  outcome = (peer > mine).astype(jnp.int32) - (peer < mine).astype(jnp.int32)
  score = jnp.sum(jnp.where(valid[:, None, :], outcome, 0), axis=-1)
  n_valid = jnp.sum(valid, axis=-1, keepdims=True, dtype=jnp.int32)
  reward = score.astype(jnp.float32) / jnp.maximum(n_valid - 1, 1).astype(jnp.float32)
  return jnp.where(valid, reward, 0.0)
