"""Fitting probes over (layer, L2) candidates and choosing one by RVP.

For each candidate the probe is fit on the training split, scored on the held-out split (`metrics.probe_report`,
plus the Spearman correlation of a ridge regression on s/K as a diagnostic), and its RVP is computed over a fixed
sample of base-generator tasks. The chosen probe maximises RVP (PROPEL: RVP tracked RL gains better than
accuracy).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from probe import linear
from probe import metrics


def split_indices(n: int, heldout_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(train, held-out) index arrays of a seeded permutation of range(n)."""
  if not 0 < heldout_fraction < 1:
    raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
  perm = np.random.default_rng(seed).permutation(n)
  k = max(1, int(round(n * heldout_fraction)))
  return np.sort(perm[k:]), np.sort(perm[:k])


def stratified_split(labels, heldout_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Like `split_indices` but per class, so both splits hold both classes when each class has >= 2 members."""
  y = np.asarray(labels)
  rng = np.random.default_rng(seed)
  train, held = [], []
  for c in (0, 1):
    idx = rng.permutation(np.flatnonzero(y == c))
    k = min(len(idx) - 1, max(1, int(round(len(idx) * heldout_fraction)))) if len(idx) > 1 else 0
    held.extend(idx[:k])
    train.extend(idx[k:])
  return np.sort(np.array(train, int)), np.sort(np.array(held, int))


def fit_and_select(features: Mapping[int, np.ndarray], labels, solve_rate, rvp_features: Mapping[int, np.ndarray],
                   rvp_invalid: int, *, l2s: Sequence[float], hidden: int = 0, r_bad: float = -0.2,
                   heldout_fraction: float = 0.25, seed: int = 0, steps: int = 500
                   ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
  """Fits every (layer, l2) probe and picks the one of largest RVP.

  Args:
    features: layer -> f32[N, d] features of the labelled valid tasks.
    labels: {0,1}[N] frontier labels; solve_rate: f32[N] s/K.
    rvp_features: layer -> f32[n_valid, d] features of the valid tasks of the RVP sample.
    rvp_invalid: number of invalid generations in the RVP sample (reward r_bad).
    l2s: L2 weights tried.
    hidden: MLP width (0 = linear).

  Returns:
    (best, table): best = {"layer", "l2", "params", split sizes, metrics...}; table = the same for every
    candidate, without params.
  """
  y = np.asarray(labels)
  rate = np.asarray(solve_rate, np.float64)
  train, held = stratified_split(y, heldout_fraction, seed)
  linear.check_binary_labels(y[train], len(train))
  table, best = [], None
  for layer, x in sorted(features.items()):
    x = np.asarray(x, np.float32)
    ridge = linear.fit_ridge(x[train], rate[train], l2=float(x.shape[1]))
    ridge_rho = metrics.spearman(np.asarray(linear.probe_predict(ridge, x[held])), rate[held])
    for l2 in l2s:
      params = linear.fit_linear_probe(x[train], y[train], l2=l2, hidden=hidden, steps=steps, seed=seed)
      row: dict[str, Any] = {"layer": int(layer), "l2": float(l2), "n_train": len(train), "n_heldout": len(held),
                             "heldout_in_band": int(y[held].sum()), "ridge_spearman": ridge_rho}
      held_logits = np.asarray(linear.probe_predict(params, x[held]))
      if len(set(y[held].tolist())) == 2:
        row.update(metrics.probe_report(y[held], held_logits, rate[held]))
      rvp_logits = np.asarray(linear.probe_predict(params, rvp_features[layer])) if len(rvp_features[layer]) else []
      row["rvp"] = metrics.rvp(rvp_logits, rvp_invalid, r_bad)
      table.append(row)
      if best is None or row["rvp"] > best["rvp"]:
        best = {**row, "params": params}
  return best, table
