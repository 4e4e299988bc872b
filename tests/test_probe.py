"""Probe fitting and metrics on synthetic features, and on a tiny model's real activations."""
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


@pytest.mark.parametrize("hidden", [0, 16])
def test_probe_recovers_planted_signal(hidden):
  x, y, _ = _planted()
  train, held = selection.split_indices(len(y), 0.3, seed=1)
  params = linear.fit_linear_probe(x[train], y[train], l2=1e-3, hidden=hidden, steps=300)
  logits = np.asarray(linear.probe_predict(params, x[held]))
  assert logits.shape == (len(held),)
  assert metrics.auroc(y[held], logits) > 0.9
  assert metrics.balanced_accuracy(y[held], logits) > 0.8


def test_shuffled_labels_give_chance_auroc():
  x, y, _ = _planted(n=600)
  y_shuffled = np.random.default_rng(3).permutation(y)
  train, held = selection.split_indices(len(y), 0.5, seed=2)
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


def test_selection_picks_largest_rvp():
  x, y, score = _planted(n=200, d=8)
  noise = np.random.default_rng(5).normal(size=x.shape).astype(np.float32)
  best, table = selection.fit_and_select({3: x, 5: noise}, y, 1 / (1 + np.exp(-score)), {3: x[:40], 5: noise[:40]},
                                         rvp_invalid=10, l2s=(1e-3, 1.0), steps=200)
  assert len(table) == 4
  assert best["rvp"] == max(r["rvp"] for r in table)
  _, held = selection.stratified_split(y, 0.25, 0)
  assert all(r["n_heldout"] == len(held) and r["n_train"] == 200 - len(held)
             and r["heldout_in_band"] == int(y[held].sum()) for r in table)
  signal_rows = [r for r in table if r["layer"] == 3]
  assert min(r["auroc"] for r in signal_rows) > 0.85
