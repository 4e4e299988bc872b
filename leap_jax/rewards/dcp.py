"""Difficulty-Conditioned Pruning (DCP), LEAP (arXiv 2608.01804).

A group's difficulty is its number of failed turn-1 samples. Only groups of middling
difficulty get turns 2..T; inside an expanded group a sample keeps going until it passes.
Shapes: P problems, G samples per group, T turns (index t=0 is turn 1).
"""
import numbers

import jax
import jax.numpy as jnp

from leap_jax.rewards import _checks


def dcp_gate(first_turn_success, t_min, t_max, valid=None) -> tuple[jax.Array, jax.Array]:
  """Which groups expand to turns 2..T.

    n_fail[p] = Σ_g valid[p,g]·(1 − s[p,g])
    active[p] = t_min <= n_fail[p] <= t_max

  LEAP, arXiv 2608.01804 (DCP): N_fail < T_min is easy, N_fail > T_max is hopeless; both stop
  after turn 1. Invalid samples (evaluator infrastructure errors) are not counted.

  Args:
    first_turn_success: bool[P,G], turn-1 pass/fail.
    t_min: int scalar (Python or traced), lowest failure count that expands.
    t_max: int scalar (Python or traced), highest failure count that expands.
    valid: optional bool[P,G]; default all True.

  Returns:
    active: bool[P], the group gets turns 2..T.
    n_fail: int32[P], failures among the valid turn-1 samples (a count).
  """
  fn = "dcp_gate"
  success = _checks.array(first_turn_success, "first_turn_success", fn, 2, bool)
  valid = _checks.valid_mask(valid, success.shape, fn)
  if isinstance(t_min, numbers.Real) and isinstance(t_max, numbers.Real) and t_min > t_max:
    raise ValueError(f"{fn}: t_min={t_min} is above t_max={t_max}, so no group could ever expand")
  n_fail = jnp.sum(valid & ~success, axis=-1, dtype=jnp.int32)
  active = (t_min <= n_fail) & (n_fail <= t_max)
  return active, n_fail


def dcp_next_turn(solved_so_far, active, valid=None) -> jax.Array:
  """Who gets the next turn: valid samples of active groups that have not passed yet.

    next[p,g] = valid[p,g] ∧ active[p] ∧ ¬solved_so_far[p,g]

  LEAP, arXiv 2608.01804 (DCP: a pass ends a trajectory; pruned groups stop after turn 1).

  Args:
    solved_so_far: bool[P,G], passed at some kept turn before the next one.
    active: bool[P], from `dcp_gate`.
    valid: optional bool[P,G]; default all True.

  Returns:
    bool[P,G].
  """
  fn = "dcp_next_turn"
  solved = _checks.array(solved_so_far, "solved_so_far", fn, 2, bool)
  active = _checks.array(active, "active", fn, 1, bool)
  _checks.same_shape([solved, active], ["solved_so_far", "active"], fn, 1)
  valid = _checks.valid_mask(valid, solved.shape, fn)
  return valid & active[:, None] & ~solved


def dcp_keep_mask(success, active, valid=None) -> jax.Array:
  """Which (sample, turn) pairs exist in a DCP rollout.

    keep[p,g,1] = valid[p,g]
    keep[p,g,t] = next_turn(solved_<t, active, valid)[p,g],  t > 1,
    solved_<t[p,g] = ∨_{j<t} keep[p,g,j] ∧ s[p,g,j]

  LEAP, arXiv 2608.01804 (DCP). `success` is read only where kept, so entries of turns that
  were never run may hold anything.

  Args:
    success: bool[P,G,T], pass/fail of each turn.
    active: bool[P], from `dcp_gate`.
    valid: optional bool[P,G]; default all True.

  Returns:
    bool[P,G,T]; for every sample the kept turns are a prefix 1..k.
  """
  fn = "dcp_keep_mask"
  success = _checks.array(success, "success", fn, 3, bool)
  active = _checks.array(active, "active", fn, 1, bool)
  _checks.same_shape([success, active], ["success", "active"], fn, 1)
  valid = _checks.valid_mask(valid, success.shape[:2], fn)
  keep = [valid]
  solved = jnp.zeros_like(valid)
  for t in range(1, success.shape[-1]):
    solved = solved | (keep[-1] & success[..., t - 1])
    keep.append(dcp_next_turn(solved, active, valid))
  return jnp.stack(keep, axis=-1)
