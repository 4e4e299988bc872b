"""Rollout statistics from grouped arrays, on the host (numpy).

Shapes: P problems, G samples per group, T turns (index t = 0 is turn 1). Inputs follow
`leap_jax.rewards`: success bool[P, G, T] (a turn passed), keep bool[P, G, T] (the turn exists and
was evaluated: a prefix of turns per sample), active bool[P] (DCP expanded the group to turns 2..T),
valid bool[P, G] (the evaluator judged the sample), status int32[P, G, T] codes into
`kernels_eval.schema.STATUSES`.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from kernels_eval.schema import STATUSES


def _check(name: str, x, ndim: int, shape: Optional[tuple] = None) -> np.ndarray:
  x = np.asarray(x)
  if x.ndim != ndim:
    raise ValueError(f"{name} must have {ndim} dims, got shape {x.shape}")
  if shape is not None and x.shape != shape:
    raise ValueError(f"{name} has shape {x.shape}, expected {shape}")
  return x


def _valid(valid, shape) -> np.ndarray:
  return np.ones(shape, bool) if valid is None else _check("valid", valid, 2, shape).astype(bool)


def cumulative_pass_rate(success, keep, valid=None) -> np.ndarray:
  """Acc@k for k = 1..T: share of valid samples with a kept pass at a turn <= k.

    acc[k] = mean_{valid (p,g)} max_{t <= k} keep[p,g,t] * success[p,g,t]

  Returns f32[T] (NaN when no sample is valid); non-decreasing in k.
  """
  success = _check("success", success, 3).astype(bool)
  keep = _check("keep", keep, 3, success.shape).astype(bool)
  valid = _valid(valid, success.shape[:2])
  solved_by = np.logical_or.accumulate(success & keep, axis=-1)[valid]  # [n, T]
  if not len(solved_by):
    return np.full(success.shape[-1], np.nan, np.float32)
  return solved_by.mean(axis=0).astype(np.float32)


def activated_groups_share(active) -> float:
  """Share of groups DCP expanded beyond turn 1 (LEAP reports 43.9% for its default)."""
  active = _check("active", active, 1).astype(bool)
  return float(active.mean()) if active.size else float("nan")


def signal_groups_share(advantages, keep) -> float:
  """Share of groups with a non-zero advantage on some kept turn (groups that produce a gradient)."""
  advantages = _check("advantages", advantages, 3)
  keep = _check("keep", keep, 3, advantages.shape).astype(bool)
  live = np.any((advantages != 0) & keep, axis=(1, 2))
  return float(live.mean()) if live.size else float("nan")


def mean_first_pass_turn(success, keep, valid=None) -> float:
  """Mean (1-based) turn of the first pass over samples that passed; NaN when none passed."""
  success = _check("success", success, 3).astype(bool)
  keep = _check("keep", keep, 3, success.shape).astype(bool)
  hit = success & keep & _valid(valid, success.shape[:2])[..., None]
  passed = hit.any(axis=-1)
  if not passed.any():
    return float("nan")
  return float((np.argmax(hit, axis=-1)[passed] + 1).mean())


def turns_per_pass(success, keep, valid=None) -> float:
  """Evaluated turns spent per passing sample: sum(keep) / #samples with a pass (inf when none passed)."""
  success = _check("success", success, 3).astype(bool)
  keep = _check("keep", keep, 3, success.shape).astype(bool)
  valid = _valid(valid, success.shape[:2])
  turns = keep[valid].sum()
  passes = (success & keep)[valid].any(axis=-1).sum()
  return float(turns / passes) if passes else float("inf")


def group_recovery(success, keep, active, valid=None) -> dict[str, float]:
  """LEAP's per-group recovery among activated groups: what later turns fixed of turn 1's failures.

  With F = valid samples of activated groups that were evaluated and failed at turn 1, and f[p,g] the turn of
  their first later pass (none if never):
    recovery/fixed_at_turn_<t> = #{F : f = t} / #F            for t = 2..T
    recovery/groups_any_fixed  = #{activated groups with some f} / #{activated groups with some F}
  NaN where the denominator is empty.
  """
  success = _check("success", success, 3).astype(bool)
  keep = _check("keep", keep, 3, success.shape).astype(bool)
  active = _check("active", active, 1, success.shape[:1]).astype(bool)
  failed = active[:, None] & _valid(valid, success.shape[:2]) & keep[..., 0] & ~success[..., 0]  # [P, G]
  hit = success & keep
  first = np.where(hit.any(-1), np.argmax(hit, axis=-1), -1)  # [P, G] 0-based turn of the first pass
  n_failed = failed.sum()
  out = {f"recovery/fixed_at_turn_{t + 1}": float((failed & (first == t)).sum() / n_failed) if n_failed
         else float("nan") for t in range(1, success.shape[-1])}
  groups = failed.any(-1)
  fixed = (failed & (first > 0)).any(-1)
  out["recovery/groups_any_fixed"] = float(fixed.sum() / groups.sum()) if groups.any() else float("nan")
  return out


def status_histogram(status, keep, names: Sequence[str] = STATUSES) -> dict[str, int]:
  """Count of each status over kept turns: {name: count} for every name in `names` (code i is names[i])."""
  status = _check("status", status, 3)
  keep = _check("keep", keep, 3, status.shape).astype(bool)
  codes = status[keep].astype(np.int64)
  if codes.size and (codes.min() < 0 or codes.max() >= len(names)):
    raise ValueError(f"status codes must be in [0, {len(names)}), got range [{codes.min()}, {codes.max()}]")
  counts = np.bincount(codes, minlength=len(names))
  return {name: int(c) for name, c in zip(names, counts)}


def summary_stats(x, mask=None, prefix: str = "") -> dict[str, float]:
  """{prefix/mean, prefix/std, prefix/min, prefix/max} over x[mask] (NaN when empty)."""
  x = np.asarray(x, np.float64)
  values = x[np.asarray(mask, bool)] if mask is not None else x.ravel()
  if not values.size:
    return {f"{prefix}/{k}": float("nan") for k in ("mean", "std", "min", "max")}
  return {f"{prefix}/mean": float(values.mean()), f"{prefix}/std": float(values.std()),
          f"{prefix}/min": float(values.min()), f"{prefix}/max": float(values.max())}


def rollout_metrics(success, keep, active, rewards, advantages, status, valid=None,
                    status_names: Sequence[str] = STATUSES) -> dict[str, float]:
  """All rollout metrics of one batch as a flat dict.

  Args:
    success, keep: bool[P, G, T].
    active: bool[P].
    rewards: f32[P, G] trajectory rewards.
    advantages: f32[P, G, T] per-turn advantages.
    status: int32[P, G, T] status codes.
    valid: optional bool[P, G].
    status_names: the name of each status code.

  Returns:
    pass_rate/turn_<k> (k = 1..T), groups/activated_share, groups/signal_share, turns/first_pass_mean,
    turns/per_pass, turns/mean (kept turns per sample), recovery/* (`group_recovery`), status/<name> (share of
    kept turns),
    reward/{mean,std,min,max} over valid samples, advantage/{...} over kept turns.
  """
  success = _check("success", success, 3).astype(bool)
  shape = success.shape
  keep = _check("keep", keep, 3, shape).astype(bool)
  valid_mask = _valid(valid, shape[:2])
  out = {f"pass_rate/turn_{k + 1}": float(v) for k, v in enumerate(cumulative_pass_rate(success, keep, valid))}
  out["groups/activated_share"] = activated_groups_share(_check("active", active, 1, shape[:1]))
  out["groups/signal_share"] = signal_groups_share(advantages, keep)
  out["turns/first_pass_mean"] = mean_first_pass_turn(success, keep, valid)
  out["turns/per_pass"] = turns_per_pass(success, keep, valid)
  out["turns/mean"] = float(keep[valid_mask].sum(-1).mean()) if valid_mask.any() else float("nan")
  out.update(group_recovery(success, keep, active, valid))
  hist = status_histogram(status, keep, status_names)
  total = max(sum(hist.values()), 1)
  out.update({f"status/{k}": v / total for k, v in hist.items()})
  out.update(summary_stats(_check("rewards", rewards, 2, shape[:2]), valid_mask, "reward"))
  out.update(summary_stats(_check("advantages", advantages, 3, shape), keep, "advantage"))
  return out
