"""leap_jax.rewards: hand-computed cases, properties, jit/vmap, and the loop reference."""
import os
import pathlib
import subprocess
import sys
import types

import chex
import hypothesis
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
import jax
import numpy as np
import pytest

from leap_jax import rewards
import test_rewards_reference as ref

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
F = 4  # level of a sample that never passed, with T = 3
PROPERTY_SETTINGS = hypothesis.settings(max_examples=30, deadline=None, derandomize=True)

# Jitted copies for the value tests: one compile per shape is far cheaper on CPU than eager
# op-by-op dispatch. Bad-input tests and the `without_jit` variants call `rewards` directly.
J = types.SimpleNamespace(**{
    name: jax.jit(getattr(rewards, name), static_argnames=("scale_by_std",) if "grpo" in name else ())
    for name in rewards.__all__ if name != "LeapRewards"})


def _np(x):
  return np.asarray(x)


def test_import_leaves_out_heavy_frameworks():
  heavy = ["flax", "optax", "orbax", "transformers", "torch"]
  code = ("import sys, leap_jax.rewards; "
          f"print(sorted(m for m in {heavy!r} if any(k == m or k.startswith(m + '.') for k in sys.modules)))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"}, cwd=REPO_ROOT)
  assert out.stdout.strip() == "[]", out.stdout


def test_exports_exactly_the_public_api():
  assert set(rewards.__all__) == {
      "LeapRewards", "any_turn_success_reward", "dcp_gate", "dcp_keep_mask", "dcp_next_turn",
      "first_pass_turn", "grpo_advantages", "kevin_returns", "leap_rewards", "rank_reward",
      "rloo_advantages", "trloo_advantages", "turn_advantages"}
  assert all(hasattr(rewards, name) for name in rewards.__all__)


# ---------------------------------------------------------------- hand-computed cases


@pytest.mark.parametrize("rank_reward", [J.rank_reward, ref.rank_reward], ids=["lib", "ref"])
@pytest.mark.parametrize("levels,expected", [
    ([1, 2, F, F, F, F, F, F], [1, 5 / 7] + [-2 / 7] * 6),
    ([1, 1, 2, F, F, F, F, F], [6 / 7, 6 / 7, 3 / 7] + [-3 / 7] * 5),
    ([1] * 7 + [F], [1 / 7] * 7 + [-1]),
    ([F] * 8, [0] * 8),
])
def test_rank_reward_paper_examples(rank_reward, levels, expected):
  np.testing.assert_allclose(_np(rank_reward(np.array([levels], np.int32)))[0], expected, atol=1e-6)


def test_rank_reward_excludes_invalid_samples():
  level = np.array([[1, 2, F, F], [1, 2, F, F], [3, 3, 3, 1]], np.int32)
  valid = np.array([[True, True, False, True], [False, False, True, False], [False] * 4])
  # Row 0: three valid peers at levels 1, 2, F -> (2, 0, -2) / 2. Rows 1, 2: fewer than 2 valid.
  np.testing.assert_allclose(J.rank_reward(level, valid), [[1, 0, 0, -1], [0] * 4, [0] * 4])


@pytest.mark.parametrize("fails,expected", [(3, False), (4, True), (7, True), (8, False)])
def test_dcp_gate_threshold_boundaries(fails, expected):
  first = np.array([[False] * fails + [True] * (8 - fails)])
  active, n_fail = J.dcp_gate(first, 4, 7)
  assert n_fail.tolist() == [fails] and active.tolist() == [expected]


def test_dcp_gate_counts_only_valid_failures_and_takes_traced_thresholds():
  first = np.array([[False] * 5 + [True] * 3, [False] * 8])
  valid = np.array([[False, False] + [True] * 6, [True] * 8])
  gate = J.dcp_gate
  active, n_fail = gate(first, 4, 8, valid)
  assert n_fail.tolist() == [3, 8] and active.tolist() == [False, True]
  active, _ = gate(first, 3, 7, valid)
  assert active.tolist() == [True, False]
  with pytest.raises(ValueError, match="t_min=5 is above t_max=4"):
    rewards.dcp_gate(first, 5, 4)


def test_dcp_next_turn():
  solved = np.array([[True, False, False], [False, False, True]])
  valid = np.array([[True, True, False], [True, True, True]])
  nxt = J.dcp_next_turn(solved, np.array([True, False]), valid)
  assert nxt.tolist() == [[False, True, False], [False, False, False]]


def test_dcp_keep_mask_and_first_pass_turn():
  t, f = True, False
  success = np.array([
      [[f, t, t], [t, f, f], [f, f, f], [f, f, t], [t, t, t]],  # active group
      [[f, t, f], [t, f, f], [f, f, f], [f, f, t], [f, t, f]],  # pruned group
  ])
  valid = np.array([[t, t, t, t, f], [t, t, t, t, t]])
  keep = J.dcp_keep_mask(success, np.array([t, f]), valid)
  assert keep.tolist() == [
      [[t, t, f], [t, f, f], [t, t, t], [t, t, t], [f, f, f]],
      [[t, f, f]] * 5,
  ]
  # Passes on turns that were never run do not count.
  assert J.first_pass_turn(success, keep).tolist() == [[2, 1, 4, 3, 4], [4, 1, 4, 4, 4]]


def test_turn_advantages_discounts_positive_credit_back_from_the_first_pass():
  traj_adv = np.array([[0.6, -0.4, 0.2, 0.8, 0.5]], np.float32)
  level = np.array([[3, 2, F, 1, 2]], np.int32)
  keep = np.array([[[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1], [0, 0, 0]]], bool)
  adv = J.turn_advantages(traj_adv, level, keep, 0.5)
  np.testing.assert_allclose(adv[0], [
      [0.15, 0.3, 0.6],  # passed at turn 3: gamma^2 A, gamma A, A
      [-0.4, -0.4, 0.0],  # negative: every kept turn
      [0.2, 0.2, 0.2],  # positive but never passed: every kept turn
      [0.8, 0.0, 0.0],  # turns after the first pass get nothing even if kept
      [0.0, 0.0, 0.0],  # nothing kept
  ], atol=1e-7)
  np.testing.assert_allclose(J.turn_advantages(traj_adv, level, keep, 0.0)[0, 0], [0, 0, 0.6])


def test_leap_rewards_hand_case():
  t, f = True, False
  success = np.array([
      [[t, f, f], [f, t, f], [f, f, f], [f, f, t]],  # 3 of 4 fail at turn 1 -> expanded
      [[t, t, t], [t, f, f], [t, f, f], [f, t, t]],  # 1 of 4 fails -> pruned
  ])
  out = J.leap_rewards(success, t_min=2, t_max=4, gamma=0.5)
  assert out.active.tolist() == [t, f] and out.n_fail.tolist() == [3, 1]
  assert out.level.tolist() == [[1, 2, F, 3], [1, 1, 1, F]]
  np.testing.assert_allclose(out.reward, [[1, 1 / 3, -1, -1 / 3], [1 / 3, 1 / 3, 1 / 3, -1]], atol=1e-6)
  np.testing.assert_allclose(out.advantages, [
      [[1, 0, 0], [1 / 6, 1 / 3, 0], [-1, -1, -1], [-1 / 3, -1 / 3, -1 / 3]],
      [[1 / 3, 0, 0], [1 / 3, 0, 0], [1 / 3, 0, 0], [-1, 0, 0]],
  ], atol=1e-6)


def test_kevin_returns_hand_case():
  scores = np.array([[[1.0, 2.0, 3.0], [1.0, 2.0, np.nan], [0.5, 0.0, 0.0]]], np.float32)
  keep = np.array([[[1, 1, 1], [1, 1, 0], [1, 0, 1]]], bool)
  np.testing.assert_allclose(J.kevin_returns(scores, keep)[0], [
      [1 + 0.4 * 2 + 0.16 * 3, 2 + 0.4 * 3, 3],
      [1 + 0.4 * 2, 2, 0],  # the unkept NaN is never read
      [0.5, 0, 0],  # an unkept turn neither gets a return nor contributes one
  ], rtol=1e-6)


def test_trloo_advantages_hand_case():
  returns = np.array([[[1.0, 5.0], [2.0, 7.0], [4.0, np.nan]]], np.float32)
  keep = np.array([[[1, 1], [1, 1], [1, 0]]], bool)
  np.testing.assert_allclose(J.trloo_advantages(returns, keep)[0], [
      [1 - 3, 5 - 7], [2 - 2.5, 7 - 5], [4 - 1.5, 0]])
  alone = J.trloo_advantages(returns, np.array([[[1, 1], [0, 0], [0, 0]]], bool))
  np.testing.assert_array_equal(alone, np.zeros_like(returns))


def test_grpo_and_rloo_hand_cases():
  r = np.array([[1.0, 0.0, 0.0, 1.0]], np.float32)
  std = np.sqrt(1 / 3)  # unbiased: sum of squares 1, n - 1 = 3
  np.testing.assert_allclose(J.grpo_advantages(r), [[0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std]],
                             rtol=1e-5)
  np.testing.assert_allclose(J.grpo_advantages(r, scale_by_std=False), [[0.5, -0.5, -0.5, 0.5]])
  np.testing.assert_allclose(J.rloo_advantages(r), [[2 / 3, -2 / 3, -2 / 3, 2 / 3]], rtol=1e-6)
  np.testing.assert_array_equal(J.grpo_advantages(np.ones((1, 4), np.float32)), np.zeros((1, 4)))


def test_grpo_and_rloo_exclude_invalid_samples():
  r = np.array([[1.0, 0.0, np.nan, 1.0], [3.0, np.nan, 1.0, 2.0]], np.float32)
  valid = np.array([[True, True, False, True], [True, False, False, False]])
  np.testing.assert_allclose(J.rloo_advantages(r, valid), [[0.5, -1.0, 0, 0.5], [0] * 4])
  np.testing.assert_allclose(J.grpo_advantages(r, valid, scale_by_std=False),
                             [[1 / 3, -2 / 3, 0, 1 / 3], [0] * 4], rtol=1e-6)
  adv = J.grpo_advantages(r, valid)
  assert np.all(np.isfinite(adv)) and adv[0, 2] == 0 and np.all(adv[1] == 0)
  np.testing.assert_allclose(np.std(_np(adv)[0, [0, 1, 3]], ddof=1), 1.0, rtol=1e-5)


def test_any_turn_success_reward():
  success = np.array([[[0, 0, 1], [0, 1, 0], [1, 0, 0]]], bool)
  keep = np.array([[[1, 1, 1], [1, 0, 0], [1, 0, 0]]], bool)
  np.testing.assert_array_equal(J.any_turn_success_reward(success, keep), [[1.0, 0.0, 1.0]])


@pytest.mark.parametrize("call,error,match", [
    (lambda: rewards.rank_reward(np.ones((2, 3), np.float32)), AssertionError,
     "`level` must have dtype kind int"),
    (lambda: rewards.rank_reward(np.ones((2, 3, 1), np.int32)), AssertionError, "`level` must have rank 2"),
    (lambda: rewards.leap_rewards(np.ones((2, 3, 2), np.int32), 1, 3, 1.0), AssertionError, "`success`"),
    (lambda: rewards.leap_rewards(np.ones((2, 3), bool), 1, 3, 1.0), AssertionError, "rank 3"),
    (lambda: rewards.leap_rewards(np.ones((2, 3, 2), bool), 1, 3, 1.0, np.ones((2, 4), bool)),
     AssertionError, "`valid` must have shape"),
    (lambda: rewards.leap_rewards(np.ones((2, 3, 2), bool), 1, 3, 1.5), ValueError, "gamma=1.5"),
    (lambda: rewards.kevin_returns(np.ones((2, 3, 2), np.float32), np.ones((2, 3, 3), bool)),
     AssertionError, "`scores`, `keep` must share"),
    (lambda: rewards.dcp_keep_mask(np.ones((2, 3, 2), bool), np.ones(3, bool)), AssertionError, "`active`"),
    (lambda: rewards.grpo_advantages(np.ones((2, 3), np.float32), eps=0.0), ValueError, "eps=0.0"),
    (lambda: rewards.grpo_advantages(np.ones((2, 3), np.float32), scale_by_std=1), TypeError, "scale_by_std"),
])
def test_bad_input_names_the_problem(call, error, match):
  with pytest.raises(error, match=match):
    call()


# ---------------------------------------------------------------- the loop reference on random inputs


def _random_batch(rng, p, g, t):
  """Success with a per-problem pass rate (so every gate outcome occurs), ~15% invalid samples."""
  rate = rng.uniform(0, 1, size=(p, 1, 1))
  success = rng.uniform(size=(p, g, t)) < rate
  valid = rng.uniform(size=(p, g)) > 0.15
  return success, valid


def _assert_leap_matches_reference(out, expected):
  for field in ("active", "n_fail", "keep", "level"):
    np.testing.assert_array_equal(_np(getattr(out, field)), np.array(expected[field]), err_msg=field)
  for field in ("reward", "advantages"):
    np.testing.assert_allclose(_np(getattr(out, field)), np.array(expected[field]), atol=1e-6, err_msg=field)


SHAPES = [(6, 8, 3), (5, 4, 2), (3, 16, 4)]


@pytest.mark.parametrize("shape", SHAPES)
def test_leap_rewards_matches_reference(shape):
  rng = np.random.default_rng(sum(shape))
  g = shape[1]
  for t_min, t_max, gamma in [(g // 2, g, 1.0), (0, g - 1, 0.5), (1, 2, 0.0), (g // 4, 3 * g // 4, 0.9)]:
    success, valid = _random_batch(rng, *shape)
    out = J.leap_rewards(success, t_min, t_max, gamma, valid)
    expected = ref.leap_rewards(ref.as_lists(success), t_min, t_max, gamma, ref.as_lists(valid))
    _assert_leap_matches_reference(out, expected)


def _random_baseline_inputs(rng, p, g, t):
  success, valid = _random_batch(rng, p, g, t)
  keep = rng.uniform(size=(p, g, t)) < 0.7  # any pattern, not only a DCP prefix
  scores = rng.normal(size=(p, g, t)).astype(np.float32)
  r = rng.normal(size=(p, g)).astype(np.float32)
  r[0] = 1.0  # one group with no spread
  level = rng.integers(1, t + 2, size=(p, g)).astype(np.int32)
  return r, valid, scores, keep, success, level


def _all_baselines(r, valid, scores, keep, success, level):
  returns = rewards.kevin_returns(scores, keep, 0.4)
  return dict(
      grpo=rewards.grpo_advantages(r, valid),
      dr_grpo=rewards.grpo_advantages(r, valid, scale_by_std=False),
      rloo=rewards.rloo_advantages(r, valid),
      kevin=returns,
      trloo=rewards.trloo_advantages(returns, keep),
      any_turn=rewards.any_turn_success_reward(success, keep),
      first_pass=rewards.first_pass_turn(success, keep),
      turn_adv=rewards.turn_advantages(r, level, keep, 0.7),
  )


def _assert_baselines_match_reference(got, r, valid, scores, keep, success, level):
  r_l, v_l, s_l, k_l = map(ref.as_lists, (r, valid, success, keep))
  expected = dict(
      grpo=ref.grpo_advantages(r_l, v_l, 1e-6, True),
      dr_grpo=ref.grpo_advantages(r_l, v_l, 1e-6, False),
      rloo=ref.rloo_advantages(r_l, v_l),
      kevin=ref.kevin_returns(ref.as_lists(scores), k_l, 0.4),
      trloo=ref.trloo_advantages(ref.as_lists(got["kevin"]), k_l),
      any_turn=ref.any_turn_success_reward(s_l, k_l),
      first_pass=ref.first_pass_turn(s_l, k_l),
      turn_adv=ref.turn_advantages(r_l, ref.as_lists(level), k_l, 0.7),
  )
  for name, value in expected.items():
    np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("shape", SHAPES)
def test_baselines_match_reference(shape):
  inputs = _random_baseline_inputs(np.random.default_rng(100 + sum(shape)), *shape)
  _assert_baselines_match_reference(jax.jit(_all_baselines)(*inputs), *inputs)


# ---------------------------------------------------------------- jit and vmap


class JitTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_leap_rewards_with_traced_thresholds_and_gamma(self):
    success, valid = _random_batch(np.random.default_rng(7), 4, 8, 3)
    out = self.variant(rewards.leap_rewards)(success, 4, 8, 0.5, valid)
    expected = ref.leap_rewards(ref.as_lists(success), 4, 8, 0.5, ref.as_lists(valid))
    _assert_leap_matches_reference(out, expected)

  @chex.variants(with_jit=True, without_jit=True)
  def test_baselines(self):
    inputs = _random_baseline_inputs(np.random.default_rng(8), 4, 8, 3)
    _assert_baselines_match_reference(self.variant(_all_baselines)(*inputs), *inputs)


def test_vmap_over_a_batch_axis_matches_per_batch_calls():
  b, p, g, t = 3, 4, 8, 3
  rng = np.random.default_rng(9)
  success = rng.uniform(size=(b, p, g, t)) < rng.uniform(size=(b, p, 1, 1))
  valid = rng.uniform(size=(b, p, g)) > 0.15
  t_min = np.array([0, 4, 2], np.int32)
  gamma = np.array([1.0, 0.5, 0.0], np.float32)
  leap = jax.jit(jax.vmap(rewards.leap_rewards, in_axes=(0, 0, None, 0, 0)))
  batched = leap(success, t_min, g, gamma, valid)
  for i in range(b):
    expected = ref.leap_rewards(ref.as_lists(success[i]), int(t_min[i]), g, float(gamma[i]),
                                ref.as_lists(valid[i]))
    _assert_leap_matches_reference(jax.tree.map(lambda x, i=i: x[i], batched), expected)
  r = rng.normal(size=(b, p, g)).astype(np.float32)
  level = _np(batched.level)
  keep = _np(batched.keep)
  returns = jax.jit(jax.vmap(rewards.kevin_returns))(r[..., None] * np.ones(t, np.float32), keep)
  cases = [("grpo_advantages", (r, valid)), ("rloo_advantages", (r, valid)), ("rank_reward", (level, valid)),
           ("trloo_advantages", (returns, keep)), ("turn_advantages", (r, level, keep, gamma)),
           ("first_pass_turn", (success, keep)), ("any_turn_success_reward", (success, keep))]
  for name, args in cases:
    got = jax.jit(jax.vmap(getattr(rewards, name)))(*args)
    for i in range(b):
      np.testing.assert_allclose(got[i], getattr(J, name)(*(a[i] for a in args)), rtol=1e-6, atol=1e-6,
                                 err_msg=name)


# ---------------------------------------------------------------- properties


@st.composite
def _levels_and_valid(draw):
  g = draw(st.sampled_from([2, 5, 8]))
  level = draw(hnp.arrays(np.int32, (3, g), elements=st.integers(1, 4)))
  valid = draw(hnp.arrays(np.bool_, (3, g), elements=st.booleans()))
  return level, valid


@PROPERTY_SETTINGS
@hypothesis.given(_levels_and_valid(), st.randoms(use_true_random=False))
def test_rank_reward_properties(level_valid, rnd):
  level, valid = level_valid
  r = _np(J.rank_reward(level, valid))
  assert np.all(r[~valid] == 0)
  assert np.all(np.abs(r) <= 1 + 1e-6)
  np.testing.assert_allclose(np.sum(r * valid, axis=-1), 0, atol=1e-5)
  for p in range(level.shape[0]):
    idx = np.flatnonzero(valid[p])
    for i in idx:
      for j in idx:
        if level[p, i] < level[p, j]:
          assert r[p, i] > r[p, j]
  perm = np.array(rnd.sample(range(level.shape[1]), level.shape[1]))
  np.testing.assert_allclose(J.rank_reward(level[:, perm], valid[:, perm]), r[:, perm], atol=1e-6)
  same = _np(J.rank_reward(np.full_like(level, 2), valid))
  np.testing.assert_array_equal(same, np.zeros_like(same))


@PROPERTY_SETTINGS
@hypothesis.given(hnp.arrays(np.bool_, (3, 6, 3), elements=st.booleans()),
                  hnp.arrays(np.bool_, (3, 6), elements=st.booleans()),
                  hnp.arrays(np.bool_, (3, 6, 3), elements=st.booleans()),
                  st.integers(0, 6), st.integers(0, 6), st.floats(0.0, 1.0))
def test_leap_rewards_properties(success, valid, noise, t_a, t_b, gamma):
  t_min, t_max = min(t_a, t_b), max(t_a, t_b)
  out = jax.tree.map(_np, J.leap_rewards(success, t_min, t_max, gamma, valid))
  keep = out.keep
  assert np.all(keep <= valid[..., None])
  assert np.all(keep[..., 1:] <= keep[..., :-1])  # kept turns form a prefix
  assert np.all(keep[~out.active][:, :, 1:] == 0)  # pruned groups stop after turn 1
  assert np.all(out.reward[~valid] == 0) and np.all(out.advantages[~keep] == 0)
  np.testing.assert_allclose(np.sum(out.reward, axis=-1), 0, atol=1e-5)
  assert np.all(out.advantages[out.reward < 0] <= 0)
  # Success on turns that were never run is never read.
  scrambled = jax.tree.map(_np, J.leap_rewards(np.where(keep, success, noise), t_min, t_max, gamma, valid))
  for a, b in zip(out, scrambled):
    np.testing.assert_array_equal(a, b)
