"""Held-out probe metrics and the reward-variance criterion used to pick a probe.

All functions take host arrays: labels {0,1}[N], logits f32[N], solve rates s/K f32[N].

  balanced accuracy = (TPR + TNR) / 2 at logit threshold 0
  AUROC = P(logit_pos > logit_neg) + P(tie) / 2 (Mann-Whitney U / (N_pos N_neg))
  Spearman = Pearson correlation of average ranks
  ECE = sum_b (n_b / N) |mean_b sigmoid(logit) - mean_b y| over `bins` equal-width probability bins
  RVP = Var_i r_i, r_i = probe logit of base-generator task i if valid else r_bad (all samples, invalid included)
  AUROC lower bound = the alpha quantile of AUROC over bootstrap resamples of whole groups (`auroc_lower_bound`)
"""
from __future__ import annotations

import numpy as np


def _binary(labels, logits, fn: str) -> tuple[np.ndarray, np.ndarray]:
  y = np.asarray(labels).astype(np.int32)
  s = np.asarray(logits, np.float64)
  if y.shape != s.shape or y.ndim != 1:
    raise ValueError(f"{fn}: labels {y.shape} and logits {s.shape} must be equal 1-d shapes")
  if not (np.any(y == 1) and np.any(y == 0)):
    raise ValueError(f"{fn}: labels hold a single class; the metric is undefined")
  return y, s


def balanced_accuracy(labels, logits) -> float:
  y, s = _binary(labels, logits, "balanced_accuracy")
  pred = s > 0
  return float(0.5 * (pred[y == 1].mean() + (~pred[y == 0]).mean()))


def average_ranks(x) -> np.ndarray:
  """1-based ranks with ties sharing their average rank."""
  x = np.asarray(x, np.float64)
  order = np.argsort(x, kind="mergesort")
  ranks = np.empty(len(x), np.float64)
  sorted_x = x[order]
  i = 0
  while i < len(x):
    j = i
    while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
      j += 1
    ranks[order[i:j + 1]] = 0.5 * (i + j) + 1.0
    i = j + 1
  return ranks


def auroc(labels, logits) -> float:
  y, s = _binary(labels, logits, "auroc")
  r = average_ranks(s)
  n_pos, n_neg = int(y.sum()), int((1 - y).sum())
  return float((r[y == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def weighted_auroc(labels, logits, weights) -> np.ndarray:
  """AUROC with sample weights, one value per row of weights f[B, N] (NaN where a class has zero weight):

    sum_{i pos, j neg} w_i w_j (1[s_i > s_j] + 1[s_i = s_j] / 2) / (sum_pos w * sum_neg w).
  """
  y, s = np.asarray(labels).astype(np.float64), np.asarray(logits, np.float64)
  order = np.argsort(s, kind="mergesort")
  w = np.atleast_2d(np.asarray(weights, np.float64))[:, order]
  starts = np.flatnonzero(np.r_[True, np.diff(s[order]) != 0])  # runs of tied logits
  pos = np.add.reduceat(w * y[order], starts, axis=1)  # [B, runs]
  neg = np.add.reduceat(w * (1.0 - y[order]), starts, axis=1)
  below = np.cumsum(neg, axis=1) - neg
  num = np.sum(pos * (below + 0.5 * neg), axis=1)
  den = pos.sum(1) * neg.sum(1)
  return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def auroc_lower_bound(labels, logits, groups, *, alpha: float = 0.05, replicates: int = 2000,
                      seed: int = 0) -> float:
  """One-sided (1 - alpha) lower confidence bound on AUROC: the alpha quantile of AUROC over `replicates`
  bootstrap resamples that draw whole groups with replacement (tasks of a group are not independent).

  Args:
    labels: {0,1}[N]; logits: f32[N] (e.g. out-of-fold logits); groups: [N] hashable group of each task.
  """
  y, s = _binary(labels, logits, "auroc_lower_bound")
  _, g = np.unique(np.asarray(groups), return_inverse=True)
  if not 0 < alpha < 1 or g.max() < 1:
    raise ValueError(f"auroc_lower_bound needs 0 < alpha < 1 and at least 2 groups, got alpha={alpha}, "
                     f"{g.max() + 1} group(s)")
  n_groups = g.max() + 1
  draws = np.random.default_rng(seed).integers(0, n_groups, size=(replicates, n_groups))
  counts = np.zeros((replicates, n_groups))
  np.add.at(counts, (np.arange(replicates)[:, None], draws), 1.0)
  return float(np.nanquantile(weighted_auroc(y, s, counts[:, g]), alpha))


def spearman(a, b) -> float:
  """Rank correlation; NaN when either side is constant."""
  ra, rb = average_ranks(a), average_ranks(b)
  if ra.std() == 0 or rb.std() == 0:
    return float("nan")
  return float(np.corrcoef(ra, rb)[0, 1])


def expected_calibration_error(labels, logits, bins: int = 10) -> float:
  y, s = _binary(labels, logits, "expected_calibration_error")
  p = 1.0 / (1.0 + np.exp(-s))
  idx = np.minimum((p * bins).astype(np.int64), bins - 1)
  err = 0.0
  for b in range(bins):
    m = idx == b
    if m.any():
      err += m.mean() * abs(p[m].mean() - y[m].mean())
  return float(err)


def rvp(logits_valid, num_invalid: int, r_bad: float = -0.2) -> float:
  """Variance of the generator reward over a fixed base-generator sample (valid logits + invalid at r_bad)."""
  r = np.concatenate([np.asarray(logits_valid, np.float64).ravel(), np.full(int(num_invalid), float(r_bad))])
  if r.size < 2:
    raise ValueError(f"rvp needs at least 2 samples, got {r.size}")
  return float(r.var())


def probe_report(labels, logits, solve_rate) -> dict[str, float]:
  """Held-out classification metrics of one probe."""
  return {"balanced_accuracy": balanced_accuracy(labels, logits), "auroc": auroc(labels, logits),
          "spearman": spearman(logits, solve_rate), "ece": expected_calibration_error(labels, logits)}
