"""LEAP rewards end to end (arXiv 2608.01804): DCP, rank reward and credit across turns.

Shapes: P problems, G samples per group, T turns (index t=0 is turn 1).
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp

from leap_jax.rewards import _checks
from leap_jax.rewards import dcp
from leap_jax.rewards import rank


class LeapRewards(NamedTuple):
  """Everything `leap_rewards` computes for one batch of groups.

  active: bool[P], the group was expanded to turns 2..T.
  n_fail: int32[P], failed valid turn-1 samples.
  keep: bool[P,G,T], (sample, turn) pairs that exist and train.
  level: int32[P,G], first passing turn, T+1 if none.
  reward: float32[P,G], the rank reward (the trajectory advantage).
  advantages: float32[P,G,T], per-turn advantages, 0 where not kept.
  """
  active: jax.Array
  n_fail: jax.Array
  keep: jax.Array
  level: jax.Array
  reward: jax.Array
  advantages: jax.Array


def turn_advantages(traj_adv, level, keep, gamma) -> jax.Array:
  """Spreads a trajectory advantage over its turns.

    A>0 and first pass at turn k:  a[t] = gamma^(k−t) · A  for t <= k,  0 for t > k
    otherwise (A<=0 or no pass):   a[t] = A
    a[t] = 0 where not kept

  LEAP, arXiv 2608.01804: positive credit flows back to earlier turns with a discount,
  negative credit applies to every turn.

  Args:
    traj_adv: float[P,G], e.g. `rank_reward`.
    level: int[P,G], first passing turn in 1..T, T+1 (or more) for none.
    keep: bool[P,G,T].
    gamma: discount in [0, 1] (Python or traced scalar).

  Returns:
    float[P,G,T], the dtype of `traj_adv`.
  """
  fn = "turn_advantages"
  traj_adv = _checks.array(traj_adv, "traj_adv", fn, 2, float)
  level = _checks.array(level, "level", fn, 2, int)
  keep = _checks.array(keep, "keep", fn, 3, bool)
  _checks.same_shape([traj_adv, level, keep], ["traj_adv", "level", "keep"], fn, 2)
  _checks.discount(gamma, fn)
  num_turns = keep.shape[-1]
  turn = jnp.arange(1, num_turns + 1, dtype=jnp.int32)
  lag = level[..., None] - turn  # [P,G,T], k − t
  weights = jnp.where(lag >= 0, jnp.power(gamma, jnp.maximum(lag, 0).astype(traj_adv.dtype)), 0.0)
  credited = (traj_adv > 0) & (level <= num_turns)
  adv = jnp.where(credited[..., None], weights.astype(traj_adv.dtype) * traj_adv[..., None],
                  traj_adv[..., None])
  return jnp.where(keep, adv, 0.0)


def leap_rewards(success, t_min, t_max, gamma, valid=None) -> LeapRewards:
  """DCP gate and keep mask, first-pass levels, rank reward and per-turn advantages.

    active, n_fail = dcp_gate(s[..., 0], t_min, t_max, valid)
    keep   = dcp_keep_mask(s, active, valid)
    level  = first_pass_turn(s, keep)
    reward = rank_reward(level, valid)
    adv    = turn_advantages(reward, level, keep, gamma)

  LEAP, arXiv 2608.01804. The project's defaults are t_min = G/2, t_max = G, gamma = 1.

  Args:
    success: bool[P,G,T], read only where kept.
    t_min: int scalar, lowest turn-1 failure count that expands a group.
    t_max: int scalar, highest turn-1 failure count that expands a group.
    gamma: discount in [0, 1].
    valid: optional bool[P,G]; default all True.

  Returns:
    A `LeapRewards`.
  """
  fn = "leap_rewards"
  success = _checks.array(success, "success", fn, 3, bool)
  _checks.discount(gamma, fn)
  valid = _checks.valid_mask(valid, success.shape[:2], fn)
  active, n_fail = dcp.dcp_gate(success[..., 0], t_min, t_max, valid)
  keep = dcp.dcp_keep_mask(success, active, valid)
  level = rank.first_pass_turn(success, keep)
  reward = rank.rank_reward(level, valid)
  advantages = turn_advantages(reward, level, keep, gamma)
  return LeapRewards(active, n_fail, keep, level, reward, advantages)
