"""A loop-by-loop reference for `leap_jax.rewards`, written from the papers' definitions.

Plain Python loops over problems, samples, peers and turns on nested lists or numpy arrays;
nothing here comes from `leap_jax`, so comparing the two catches errors in either.
`tests/test_rewards.py` compares it with the jitted functions and `bench/rewards.py` times it.
The tests at the bottom pin the reference itself to the LEAP paper's worked examples.
"""
import math

import numpy as np
import pytest


def _all_valid(p, g):
  return [[True] * g for _ in range(p)]


def dcp_gate(first, t_min, t_max, valid=None):
  """-> (active[p], n_fail[p]) as lists."""
  p_n, g_n = len(first), len(first[0])
  valid = _all_valid(p_n, g_n) if valid is None else valid
  active, n_fail = [], []
  for p in range(p_n):
    fails = 0
    for g in range(g_n):
      if valid[p][g] and not first[p][g]:
        fails += 1
    n_fail.append(fails)
    active.append(t_min <= fails <= t_max)
  return active, n_fail


def keep_mask(success, active, valid=None):
  """Replays a DCP rollout: turn 1 for valid samples, then active groups retry until a pass."""
  p_n, g_n, t_n = len(success), len(success[0]), len(success[0][0])
  valid = _all_valid(p_n, g_n) if valid is None else valid
  keep = [[[False] * t_n for _ in range(g_n)] for _ in range(p_n)]
  for p in range(p_n):
    for g in range(g_n):
      if not valid[p][g]:
        continue
      for t in range(t_n):
        keep[p][g][t] = True
        if success[p][g][t] or not active[p]:
          break
  return keep


def first_pass_turn(success, keep):
  p_n, g_n, t_n = len(success), len(success[0]), len(success[0][0])
  level = [[t_n + 1] * g_n for _ in range(p_n)]
  for p in range(p_n):
    for g in range(g_n):
      for t in range(t_n):
        if keep[p][g][t] and success[p][g][t]:
          level[p][g] = t + 1
          break
  return level


def rank_reward(level, valid=None):
  p_n, g_n = len(level), len(level[0])
  valid = _all_valid(p_n, g_n) if valid is None else valid
  reward = [[0.0] * g_n for _ in range(p_n)]
  for p in range(p_n):
    n_valid = sum(1 for g in range(g_n) if valid[p][g])
    if n_valid < 2:
      continue
    for i in range(g_n):
      if not valid[p][i]:
        continue
      wins = losses = 0
      for j in range(g_n):
        if j == i or not valid[p][j]:
          continue
        if level[p][j] > level[p][i]:
          wins += 1
        elif level[p][j] < level[p][i]:
          losses += 1
      reward[p][i] = (wins - losses) / (n_valid - 1)
  return reward


def turn_advantages(traj_adv, level, keep, gamma):
  p_n, g_n, t_n = len(keep), len(keep[0]), len(keep[0][0])
  adv = [[[0.0] * t_n for _ in range(g_n)] for _ in range(p_n)]
  for p in range(p_n):
    for g in range(g_n):
      a, k = traj_adv[p][g], level[p][g]
      for t in range(t_n):
        if not keep[p][g][t]:
          continue
        if a > 0 and k <= t_n:
          adv[p][g][t] = gamma**(k - (t + 1)) * a if t + 1 <= k else 0.0
        else:
          adv[p][g][t] = a
  return adv


def leap_rewards(success, t_min, t_max, gamma, valid=None):
  """-> dict with the fields of `LeapRewards`."""
  first = [[row[0] for row in group] for group in success]
  active, n_fail = dcp_gate(first, t_min, t_max, valid)
  keep = keep_mask(success, active, valid)
  level = first_pass_turn(success, keep)
  reward = rank_reward(level, valid)
  advantages = turn_advantages(reward, level, keep, gamma)
  return dict(active=active, n_fail=n_fail, keep=keep, level=level, reward=reward, advantages=advantages)


def grpo_advantages(rewards, valid=None, eps=1e-6, scale_by_std=True):
  p_n, g_n = len(rewards), len(rewards[0])
  valid = _all_valid(p_n, g_n) if valid is None else valid
  adv = [[0.0] * g_n for _ in range(p_n)]
  for p in range(p_n):
    vals = [rewards[p][g] for g in range(g_n) if valid[p][g]]
    if len(vals) < 2:
      continue
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean)**2 for v in vals) / (len(vals) - 1))
    for g in range(g_n):
      if valid[p][g]:
        adv[p][g] = (rewards[p][g] - mean) / (std + eps) if scale_by_std else rewards[p][g] - mean
  return adv


def rloo_advantages(rewards, valid=None):
  p_n, g_n = len(rewards), len(rewards[0])
  valid = _all_valid(p_n, g_n) if valid is None else valid
  adv = [[0.0] * g_n for _ in range(p_n)]
  for p in range(p_n):
    for i in range(g_n):
      if not valid[p][i]:
        continue
      others = [rewards[p][j] for j in range(g_n) if j != i and valid[p][j]]
      if others:
        adv[p][i] = rewards[p][i] - sum(others) / len(others)
  return adv


def kevin_returns(scores, keep, gamma=0.4):
  p_n, g_n, t_n = len(keep), len(keep[0]), len(keep[0][0])
  ret = [[[0.0] * t_n for _ in range(g_n)] for _ in range(p_n)]
  for p in range(p_n):
    for g in range(g_n):
      for t in range(t_n):
        if not keep[p][g][t]:
          continue
        for k in range(t, t_n):
          if keep[p][g][k]:
            ret[p][g][t] += gamma**(k - t) * scores[p][g][k]
  return ret


def trloo_advantages(returns, keep):
  p_n, g_n, t_n = len(keep), len(keep[0]), len(keep[0][0])
  adv = [[[0.0] * t_n for _ in range(g_n)] for _ in range(p_n)]
  for p in range(p_n):
    for t in range(t_n):
      for i in range(g_n):
        if not keep[p][i][t]:
          continue
        others = [returns[p][j][t] for j in range(g_n) if j != i and keep[p][j][t]]
        if others:
          adv[p][i][t] = returns[p][i][t] - sum(others) / len(others)
  return adv


def any_turn_success_reward(success, keep):
  p_n, g_n, t_n = len(keep), len(keep[0]), len(keep[0][0])
  return [[float(any(keep[p][g][t] and success[p][g][t] for t in range(t_n))) for g in range(g_n)]
          for p in range(p_n)]


def as_lists(x):
  """numpy array -> nested Python lists of Python scalars (what the reference loops over)."""
  return np.asarray(x).tolist()


_F = 4  # never passed with T = 3


@pytest.mark.parametrize("levels,expected_times_7", [
    ([1, 2, _F, _F, _F, _F, _F, _F], [7, 5] + [-2] * 6),
    ([1, 1, 2, _F, _F, _F, _F, _F], [6, 6, 3] + [-3] * 5),
    ([1] * 7 + [_F], [1] * 7 + [-7]),
])
def test_reference_rank_reward_matches_the_paper(levels, expected_times_7):
  np.testing.assert_allclose(rank_reward([levels])[0], np.array(expected_times_7) / 7, atol=1e-12)


def test_reference_rollout_replay():
  s = [[[False, True, False], [True, False, False], [False, False, False]]]
  assert keep_mask(s, [True]) == [[[True, True, False], [True, False, False], [True, True, True]]]
  assert keep_mask(s, [False]) == [[[True, False, False]] * 3]
  assert keep_mask(s, [True], [[True, False, True]])[0][1] == [False, False, False]
