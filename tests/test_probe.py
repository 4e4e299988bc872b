"""Probe fitting and metrics on synthetic features, and on a tiny model's real activations."""
import json

import numpy as np
import pytest

from probe import linear
from probe import metrics
from probe import selection


def _planted(n=400, d=32, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)).astype(np.float32) * rng.uniform(0.5, 20.0, size=d).astype(np.float32)
  direction = rng.normal(size=d)
  score = (x / x.std(0)) @ direction / np.linalg.norm(direction)
  y = (score + 0.3 * rng.normal(size=n) > 0.8).astype(np.int32)  # imbalanced: about 1 in 4 positive
  return x, y, score


def _split(n: int, heldout_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  perm = np.random.default_rng(seed).permutation(n)
  k = int(round(n * heldout_fraction))
  return np.sort(perm[k:]), np.sort(perm[:k])


@pytest.mark.parametrize("hidden", [0, 16])
def test_probe_recovers_planted_signal(hidden):
  x, y, _ = _planted()
  train, held = _split(len(y), 0.3, seed=1)
  params = linear.fit_linear_probe(x[train], y[train], l2=1e-3, hidden=hidden, steps=300)
  logits = np.asarray(linear.probe_predict(params, x[held]))
  assert logits.shape == (len(held),)
  assert metrics.auroc(y[held], logits) > 0.9
  assert metrics.balanced_accuracy(y[held], logits) > 0.8


def test_shuffled_labels_give_chance_auroc():
  x, y, _ = _planted(n=600)
  y_shuffled = np.random.default_rng(3).permutation(y)
  train, held = _split(len(y), 0.5, seed=2)
  params = linear.fit_linear_probe(x[train], y_shuffled[train], l2=1e-1, steps=300)
  auc = metrics.auroc(y_shuffled[held], np.asarray(linear.probe_predict(params, x[held])))
  assert 0.38 < auc < 0.62


def test_class_balancing_centres_predictions():
  x, y, _ = _planted()
  params = linear.fit_linear_probe(x, y, l2=1e-3, steps=300)
  logits = np.asarray(linear.probe_predict(params, x))
  # With balancing, both classes are mostly on their side of 0 despite the 1:3 imbalance.
  assert (logits[y == 1] > 0).mean() > 0.8 and (logits[y == 0] < 0).mean() > 0.8


def test_single_class_labels_are_a_clear_error():
  x = np.random.default_rng(0).normal(size=(10, 4))
  with pytest.raises(ValueError, match="single class"):
    linear.fit_linear_probe(x, np.zeros(10))
  with pytest.raises(ValueError, match="single class"):
    metrics.auroc(np.ones(10), np.arange(10.0))
  with pytest.raises(ValueError, match="0/1"):
    linear.fit_linear_probe(x, np.arange(10))
  with pytest.raises(ValueError, match="shape"):
    linear.fit_linear_probe(x, np.zeros(9))


def test_metrics_against_hand_values():
  y = np.array([0, 0, 1, 1])
  s = np.array([-1.0, 0.5, 0.2, 2.0])
  assert metrics.auroc(y, s) == pytest.approx(0.75)  # pairs: (0.2 > -1) yes, (0.2 > 0.5) no, 2.0 beats both
  assert metrics.balanced_accuracy(y, s) == pytest.approx(0.75)
  assert metrics.auroc(y, np.zeros(4)) == pytest.approx(0.5)
  assert metrics.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
  assert metrics.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
  assert metrics.rvp([1.0, -1.0], num_invalid=2, r_bad=0.0) == pytest.approx(0.5)
  perfect = np.array([-50.0, -50.0, 50.0, 50.0])
  assert metrics.expected_calibration_error(y, perfect) < 1e-6
  assert metrics.expected_calibration_error(y, np.zeros(4)) == pytest.approx(0.0)
  assert metrics.expected_calibration_error(np.array([0, 0, 0, 1]), np.zeros(4)) == pytest.approx(0.25)


def test_ridge_diagnostic_and_roundtrip(tmp_path):
  x, _, score = _planted()
  ridge = linear.fit_ridge(x, score, l2=1.0)
  assert metrics.spearman(np.asarray(linear.probe_predict(ridge, x)), score) > 0.95
  path = tmp_path / "probe.npz"
  linear.save_probe(path, ridge)
  again = linear.load_probe(path)
  np.testing.assert_allclose(linear.probe_predict(again, x), linear.probe_predict(ridge, x), rtol=1e-6)


SHUFFLED_L2S = (1e-3, 1e-2, 1e-1, 1.0)  # the case: on shuffled labels RVP chose 1e-3 (RVP 43.6 ... 0.03)


def _select(features, y, rvp_features, l2s):
  groups = np.arange(len(y)) // 2  # pairs of tasks share a group (and so a fold)
  return selection.fit_and_select(features, y, np.linspace(0, 1, len(y)), groups, rvp_features, rvp_invalid=10,
                                  l2s=l2s, num_folds=5, steps=200)


def test_selection_on_shuffled_labels_finds_no_eligible_probe():
  x, y, _ = _planted(n=160, d=8)
  shuffled = np.random.default_rng(3).permutation(y)
  best, table = _select({3: x}, shuffled, {3: x[:40]}, SHUFFLED_L2S)
  assert [r["l2"] for r in table] == list(SHUFFLED_L2S)
  assert max(r["rvp"] for r in table) == table[0]["rvp"]  # RVP alone still prefers the least regularised probe
  assert not any(r["eligible"] for r in table) and all(r["auroc_lower"] < 0.5 for r in table)
  assert not best["eligible"] and best["auroc_lower"] == max(r["auroc_lower"] for r in table)


def test_selection_picks_the_largest_rvp_among_eligible_probes():
  x, y, _ = _planted(n=160, d=8)
  noise = np.random.default_rng(5).normal(size=x.shape).astype(np.float32)
  # The noise layer's RVP-sample features are spread wide, so its RVP beats every signal probe's.
  best, table = _select({3: x, 5: noise}, y, {3: x[:40], 5: 30 * noise[:40]}, (1e-3, 1.0))
  assert max(r["rvp"] for r in table) > max(r["rvp"] for r in table if r["layer"] == 3)
  assert [r["eligible"] for r in table] == [True, True, False, False]
  assert best["eligible"] and best["layer"] == 3 and best["l2"] == 1e-3
  assert min(r["auroc_lower"] for r in table if r["layer"] == 3) > 0.85
  assert all(r["n_tasks"] == 160 and r["n_groups"] == 80 and r["n_folds"] == 5 for r in table)
  scaled = np.asarray(linear.probe_reward_logits(best["params"], x[:40]))
  assert scaled.mean() == pytest.approx(0.0, abs=1e-4) and scaled.std() == pytest.approx(1.0, abs=1e-4)


def test_grouped_folds_keep_groups_together_and_spread_both_classes():
  y = np.array([1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0] * 3)
  groups = np.repeat(np.arange(18), 2)
  folds = selection.grouped_folds(y, groups, 4, seed=0)
  assert all(len(set(folds[groups == g])) == 1 for g in range(18))
  assert sorted(set(folds.tolist())) == [0, 1, 2, 3]
  assert all(0 < y[folds == k].sum() < (folds == k).sum() for k in range(4))
  with pytest.raises(ValueError, match="at least 2 folds and groups"):
    selection.grouped_folds(y, np.zeros_like(y), 5, seed=0)


def test_reward_scale_puts_r_bad_at_the_same_place_for_every_probe():
  x, y, _ = _planted(n=200, d=8)
  params = linear.fit_linear_probe(x, y, l2=1e-2, steps=200)
  louder = params.replace(weights={k: 10 * v for k, v in params.weights.items()})  # same ranking, 10x logits
  ref, tasks = x[:50], x[50:60]
  a = linear.with_reward_scale(params, linear.probe_predict(params, ref))
  b = linear.with_reward_scale(louder, linear.probe_predict(louder, ref))
  np.testing.assert_allclose(linear.probe_reward_logits(a, tasks), linear.probe_reward_logits(b, tasks), atol=1e-4)
  assert not np.allclose(linear.probe_predict(params, tasks), linear.probe_predict(louder, tasks))


def test_train_generator_refuses_an_ineligible_or_unscaled_probe(tmp_path):
  x, y, _ = _planted(n=100, d=4)
  params = linear.fit_linear_probe(x, y, l2=1e-2, steps=50)
  path = tmp_path / "probe.npz"
  linear.save_probe(path, linear.with_reward_scale(params, linear.probe_predict(params, x)))
  chosen = {"layer": 3, "eligible": False, "auroc_lower": 0.41}
  (tmp_path / "report.json").write_text(json.dumps({"chosen": chosen}))
  with pytest.raises(ValueError, match=r"no demonstrated skill \(AUROC lower bound 0.410.*allow_ineligible"):
    selection.usable_probe(path)
  loaded, row = selection.usable_probe(path, allow_ineligible=True)
  assert row == chosen and float(loaded.reward_scale) > 0
  linear.save_probe(path, params)  # no reward scale: an older fit
  with pytest.raises(ValueError, match="refit it"):
    selection.usable_probe(path, allow_ineligible=True)
