"""Fitting probes over (layer, L2) candidates and choosing one that has skill, by RVP.

Shapes: N labelled valid tasks, d feature width, F folds, M valid tasks of the RVP sample.

For each candidate:
  1. Grouped F-fold cross-validation (`grouped_folds`): the tasks of one group (e.g. one normalised reference
     function, `task_groups`) share a fold, so a probe is never scored on a near-copy of a task it was fit on.
     Each fold's probe predicts its held-out tasks; the out-of-fold logits o[N] give the cross-validated metrics
     (`metrics.probe_report`) and the ridge diagnostic.
  2. Skill: auroc_lower = the one-sided lower confidence bound on AUROC(o) from a bootstrap over groups
     (`metrics.auroc_lower_bound`) at level alpha / (number of candidates) (Bonferroni, so that the chosen probe
     has skill with confidence 1 - alpha however many candidates were tried). Eligible iff auroc_lower > 0.5.
  3. The probe refit on all N tasks; RVP = variance of its raw reward over the fixed base-generator sample
     (logits of the valid tasks, r_bad for the invalid ones).
The chosen probe maximises RVP among the eligible candidates (PROPEL: RVP tracked RL gains better than accuracy;
alone, RVP rewards large logits, not skill: on shuffled labels it picks the least regularised probe). With none
eligible, the candidate with the largest auroc_lower is returned with eligible = False, and
`launch/train_generator.py` refuses it unless `probe.allow_ineligible`.
Last, the chosen probe's reward scale is set on the same sample (`linear.with_reward_scale`: the mean and std of its
logits over the M valid tasks), so r_bad means the same for every probe. RVP is measured before this step: on the
standard scale every probe would have the same RVP on that sample.
"""
from __future__ import annotations

import functools
import json
import pathlib
from typing import Any, Mapping, Sequence

import numpy as np

from probe import generator as generator_lib
from probe import linear
from probe import metrics

GROUPINGS = ("reference", "family")


def task_groups(tasks, by: str) -> list[str]:
  """The CV group of each parsed task: "reference" = its normalised reference source (tasks that differ only
  in statement, dims or inputs share a group), "family" = its op family (the probe must carry across families)."""
  if by == "reference":
    return [generator_lib.normalized_source(t.reference_source) for t in tasks]
  if by == "family":
    return [t.family for t in tasks]
  raise ValueError(f"unknown CV grouping {by!r}; choose one of {GROUPINGS}")


def grouped_folds(labels, groups, num_folds: int, seed: int) -> np.ndarray:
  """int[N] fold of each task; a group's tasks share a fold; F = min(num_folds, number of groups) >= 2.

  Groups go, largest first (seeded order among equals), to the fold holding the smallest share of the classes
  the group holds, then the fewest tasks, so both classes spread over the folds.
  """
  y = np.asarray(labels).astype(np.int64)
  _, g = np.unique(np.asarray(groups), return_inverse=True)
  n_groups = g.max() + 1 if g.size else 0
  folds = min(int(num_folds), n_groups)
  if folds < 2:
    raise ValueError(f"grouped cross-validation needs at least 2 folds and groups, got num_folds={num_folds} "
                     f"and {n_groups} group(s)")
  per_group = np.stack([np.bincount(g, weights=1 - y, minlength=n_groups),
                        np.bincount(g, weights=y, minlength=n_groups)], axis=1)  # [groups, class]
  class_total = np.maximum(per_group.sum(0), 1)
  fold_counts = np.zeros((folds, 2))
  fold_of_group = np.zeros(n_groups, np.int64)
  shuffled = np.random.default_rng(seed).permutation(n_groups)
  for k in shuffled[np.argsort(-per_group[shuffled].sum(1), kind="stable")]:
    share = (fold_counts / class_total) @ (per_group[k] > 0)
    best = np.lexsort((fold_counts.sum(1), share))[0]
    fold_of_group[k] = best
    fold_counts[best] += per_group[k]
  return fold_of_group[g]


def check_folds(labels, folds) -> None:
  """Raises ValueError when some fold's training tasks (the other folds) hold a single class."""
  y = np.asarray(labels)
  for k in np.unique(folds):
    if len(set(y[folds != k].tolist())) < 2:
      raise ValueError(f"fold {k}'s training tasks hold a single class: too few tasks of one class for "
                       f"{len(np.unique(folds))}-fold cross-validation")


def out_of_fold_logits(x, y, folds, fit, predict) -> np.ndarray:
  """f32[N]: each task's logit from `fit(x[train], y[train])` over the other folds (`predict(params, x[held])`)."""
  out = np.zeros(len(y), np.float32)
  for k in np.unique(folds):
    held = folds == k
    out[held] = np.asarray(predict(fit(x[~held], y[~held]), x[held]))
  return out


def fit_and_select(features: Mapping[int, np.ndarray], labels, solve_rate, groups,
                   rvp_features: Mapping[int, np.ndarray], rvp_invalid: int, *, l2s: Sequence[float],
                   hidden: int = 0, r_bad: float = -0.2, num_folds: int = 5, alpha: float = 0.05, seed: int = 0,
                   steps: int = 500) -> tuple[dict[str, Any], list[dict[str, Any]]]:
  """Fits every (layer, l2) probe, checks its skill and picks one (module docstring).

  Args:
    features: layer -> f32[N, d] features of the labelled valid tasks.
    labels: {0,1}[N] frontier labels; solve_rate: f32[N] s/K; groups: [N] CV group of each task.
    rvp_features: layer -> f32[M, d] features of the valid tasks of the RVP sample (M >= 2).
    rvp_invalid: number of invalid generations in the RVP sample (reward r_bad).
    l2s: L2 weights tried.
    hidden: MLP width (0 = linear).
    num_folds: F; alpha: one-sided level of the skill test over all candidates together.

  Returns:
    (best, table): best = the chosen row plus "params" (refit on all N tasks, reward scale set); table = one
    row per candidate: layer, l2, sizes, cross-validated metrics, auroc_lower, eligible, rvp.
  """
  y = linear.check_binary_labels(labels, len(np.asarray(labels)))
  rate = np.asarray(solve_rate, np.float64)
  folds = grouped_folds(y, groups, num_folds, seed)
  check_folds(y, folds)
  level = alpha / (len(features) * len(l2s))
  sizes = {"n_tasks": len(y), "n_groups": len(set(np.asarray(groups).tolist())),
           "n_folds": len(np.unique(folds)), "in_band": int(y.sum()), "alpha": level}
  table, fitted = [], []
  for layer, x in sorted(features.items()):
    x = np.asarray(x, np.float32)
    if len(rvp_features[layer]) < 2:
      raise ValueError(f"the RVP sample has {len(rvp_features[layer])} valid tasks; the reward scale needs "
                       "at least 2 (raise probe.rvp_samples)")
    ridge = out_of_fold_logits(x, rate, folds, functools.partial(linear.fit_ridge, l2=float(x.shape[1])),
                               linear.probe_predict)
    for l2 in l2s:
      fit = functools.partial(linear.fit_linear_probe, l2=l2, hidden=hidden, steps=steps, seed=seed)
      oof = out_of_fold_logits(x, y, folds, fit, linear.probe_predict)
      lower = metrics.auroc_lower_bound(y, oof, groups, alpha=level, seed=seed)
      params = fit(x, y)
      rvp_logits = np.asarray(linear.probe_predict(params, rvp_features[layer]))
      row = {"layer": int(layer), "l2": float(l2), **sizes, **metrics.probe_report(y, oof, rate),
             "ridge_spearman": metrics.spearman(ridge, rate),
             "auroc_lower": lower, "eligible": bool(lower > 0.5), "rvp": metrics.rvp(rvp_logits, rvp_invalid, r_bad)}
      table.append(row)
      fitted.append((params, rvp_logits))
  eligible = [i for i, r in enumerate(table) if r["eligible"]]
  pick = (max(eligible, key=lambda i: table[i]["rvp"]) if eligible
          else max(range(len(table)), key=lambda i: table[i]["auroc_lower"]))
  params, rvp_logits = fitted[pick]
  return {**table[pick], "params": linear.with_reward_scale(params, rvp_logits)}, table


def usable_probe(path: str | pathlib.Path, *, allow_ineligible: bool = False) -> tuple[linear.ProbeParams, dict]:
  """(probe, its report row) of a probe.npz written by `launch/fit_probe.py`, refusing one the generator must not
  train on: no report.json next to it, no reward scale, or not eligible (unless `allow_ineligible`)."""
  path = pathlib.Path(path)
  report = path.with_name("report.json")
  if not path.is_file() or not report.is_file():
    raise ValueError(f"{path} and its report.json are needed: run launch/fit_probe.py")
  chosen = json.loads(report.read_text())["chosen"]
  params = linear.load_probe(path)
  if params.reward_scale is None or "eligible" not in chosen:
    raise ValueError(f"{path} predates skill checks and reward scales: refit it with launch/fit_probe.py")
  if not chosen["eligible"] and not allow_ineligible:
    raise ValueError(f"{path} has no demonstrated skill (AUROC lower bound {chosen['auroc_lower']:.3f} <= 0.5 in "
                     "grouped cross-validation): its reward would train the generator on noise. Label more tasks "
                     "or refit; --config.probe.allow_ineligible=True uses it anyway")
  return params, chosen
