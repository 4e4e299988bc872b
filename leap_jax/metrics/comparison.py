"""Methods compared over seeds: seed-mean curves with their spread, and the cost of each method to reach equal
accuracy relative to a reference method, with a bootstrap interval over seeds.

A curve is a list of points {"step", "cumulative/<cost>", <accuracy keys>} recorded at the same steps by every
run of a comparison (held-out points from `heldout_curve.jsonl`, or training-pool points from `metrics.jsonl`).

  mean curve    c̄[s][k] = mean over seeds of c_seed[s][k], at the steps every seed recorded
  cost ratio    ρ_m(level, cost) = cost_to_reach(c̄_m, level) / cost_to_reach(c̄_ref, level)
  level         the highest accuracy every method's mean curve reached (`curves.time_to_equal_accuracy`)
  interval      2.5 / 97.5 nearest-rank percentiles of ρ_m over bootstrap resamples of the seeds drawn with
                replacement, the level held fixed; a resample where m or the reference never reaches it counts
                as ρ = inf (and `reached` gives the share that did). When every method has n seeds, the i-th
                runs of all methods share a seed (its SFT start and sampling keys), so one draw of seed indices
                serves every method (a paired bootstrap); otherwise each method's seeds are drawn apart.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from leap_jax.metrics import curves

Curve = Sequence[Mapping[str, Any]]


def _numeric(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def common_steps(runs: Sequence[Curve]) -> list[int]:
  """The steps every run recorded, in order."""
  if not runs:
    return []
  return sorted(set.intersection(*[{int(p["step"]) for p in run} for run in runs]))


def _at(run: Curve, step: int) -> Mapping[str, Any]:
  return next(p for p in run if int(p["step"]) == step)


def mean_curve(runs: Sequence[Curve]) -> list[dict[str, float]]:
  """c̄: the pointwise mean over runs of every numeric key all of them hold, at their common steps."""
  out = []
  for step in common_steps(runs):
    points = [_at(run, step) for run in runs]
    keys = set.intersection(*[{k for k, v in p.items() if _numeric(v)} for p in points]) - {"step"}
    out.append({"step": step, **{k: float(np.mean([p[k] for p in points])) for k in sorted(keys)}})
  return out


def spread(runs: Sequence[Curve], key: str) -> dict[str, np.ndarray]:
  """{"step", "mean", "std" (ddof 1), "min", "max"} of `key` over runs at their common steps (arrays [S])."""
  steps = common_steps(runs)
  values = np.array([[float(_at(run, s)[key]) for s in steps] for run in runs]).reshape(len(runs), len(steps))
  std = values.std(0, ddof=1) if len(runs) > 1 else np.zeros(len(steps))
  return {"step": np.array(steps), "mean": values.mean(0), "std": std, "min": values.min(0),
          "max": values.max(0)}


def _costs_to_reach(means: np.ndarray, level: float) -> np.ndarray:
  """Each curve's costs at its first point with accuracy >= level; inf where it never gets there.

  Args:
    means: float[..., S, 1 + C], per step the accuracy then the C cumulative costs.

  Returns:
    float[..., C].
  """
  reached = means[..., 0] >= level - 1e-12  # [..., S]
  first = np.argmax(reached, axis=-1)
  costs = np.take_along_axis(means[..., 1:], first[..., None, None], axis=-2)[..., 0, :]
  return np.where(reached.any(-1)[..., None], costs, np.inf)


def _ratio(cost: np.ndarray, base: np.ndarray) -> np.ndarray:
  """cost / base, 1 where both are 0 and inf where only the base is (never divides 0 by 0)."""
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(base > 0, cost / np.where(base > 0, base, 1.0), np.where(cost > 0, np.inf, 1.0))


def _as_array(runs: Sequence[Curve], key: str) -> np.ndarray:
  """float[seeds, S, 1 + C]: `key` then the cumulative costs at the runs' common steps."""
  steps = common_steps(runs)
  fields = (key, *curves.COSTS)
  return np.array([[[float(_at(run, s)[f]) for f in fields] for s in steps] for run in runs], float)


def cost_ratios(runs: Mapping[str, Sequence[Curve]], reference: str, key: str = "Acc@1", resamples: int = 1000,
                seed: int = 0) -> dict[str, Any] | None:
  """Cost to reach equal accuracy over `reference`'s, on the seed-mean curves, with bootstrap intervals.

  Args:
    runs: method -> its runs' curves (one per seed, in the same seed order for every method), recorded at the
      same steps.
    reference: the method the others are divided by (LEAP's "1.93x" is grpo_mt's seconds over leap's).
    key: the accuracy key of the curves.
    resamples: bootstrap resamples of the seeds (with n seeds there are at most C(2n-1, n) distinct ones).

  Returns:
    None when no level above the starting one is reached by every method; else {"level", "key", "seeds":
    {m: n}, "ratio": {m: {cost: ρ}}, "interval": {m: {cost: [lo, hi]}}, "reached": {m: share of resamples in
    which m and the reference both reached the level}}. A resample where either never reaches it counts as
    ρ = inf, so an upper bound of inf says the level is not reliably reached; the bounds are nearest-rank
    percentiles.
  """
  point = curves.time_to_equal_accuracy({m: mean_curve(r) for m, r in runs.items()}, reference, key)
  if point is None:
    return None
  level = point["level"]
  rng = np.random.default_rng(seed)
  arrays = {m: _as_array(r, key) for m, r in runs.items()}
  paired = len({len(a) for a in arrays.values()}) == 1
  n = len(arrays[reference])
  shared = rng.integers(0, n, (resamples, n))
  draws = {}  # method -> float[resamples, C]
  for m, a in arrays.items():
    drawn = shared if paired else rng.integers(0, len(a), (resamples, len(a)))
    draws[m] = _costs_to_reach(a[drawn].mean(1), level)
  base = draws[reference]
  interval, reached = {}, {}
  for m, d in draws.items():
    ratio = _ratio(d, base)
    ok = np.isfinite(d).all(-1) & np.isfinite(base).all(-1)
    ratio[~ok] = np.inf
    lo = np.percentile(ratio, 2.5, axis=0, method="lower")
    hi = np.percentile(ratio, 97.5, axis=0, method="higher")
    interval[m] = {k: [float(lo[i]), float(hi[i])] for i, k in enumerate(curves.COSTS)}
    reached[m] = float(ok.mean())
  return {"level": level, "key": key, "seeds": {m: len(r) for m, r in runs.items()}, "ratio": point["ratio"],
          "interval": interval, "reached": reached}


def run_means(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, float]:
  """The mean over steps of each of `keys` (NaN-free entries only; NaN when a key never has a value)."""
  out = {}
  for key in keys:
    values = [float(r[key]) for r in rows if key in r and _numeric(r[key]) and math.isfinite(r[key])]
    out[key] = float(np.mean(values)) if values else math.nan
  return out


POOL_KEY = "pass_rate/turn_1"
RUN_KEYS = ("groups/activated_share", "groups/signal_share", "recovery/groups_any_fixed", "time/step",
            "time/learn", "cost/generated_tokens", "cost/evaluator_calls")


def pool_curve(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
  """The training rollouts' turn-1 pass rate against cost: row s measured the policy after s updates, so its
  point is step s with the cumulative costs before step s (row s's minus its own step's)."""
  out = []
  for r in rows:
    if not (all(k in r for k in curves.COSTS) and _numeric(r.get(POOL_KEY)) and math.isfinite(r[POOL_KEY])):
      continue
    before = {k: float(r[k]) - float(r.get(own, 0.0)) for k, own in curves.COSTS.items()}
    out.append({"step": int(r["step"]), **before, POOL_KEY: float(r[POOL_KEY])})
  return out


def without_compile(curve: Curve, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """The curve with compilation taken out of its seconds: at step k, minus Σ time/compile of the steps before k.

  A run compiles in its first steps unless JAX's persistent cache already holds its programs, which depends on
  the order the runs of a comparison ran in; compile-free seconds compare the methods, not that order."""
  compile_s = {int(r["step"]): float(r.get("time/compile", 0.0)) for r in rows}
  return [{**p, "cumulative/seconds": float(p["cumulative/seconds"]) - sum(
      v for step, v in compile_s.items() if step < int(p["step"]))} for p in curve]


def _mean_std(values: Sequence[float]) -> dict[str, float]:
  values = [v for v in values if v is not None and math.isfinite(v)]
  if not values:
    return {"mean": math.nan, "std": math.nan, "n": 0}
  std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
  return {"mean": float(np.mean(values)), "std": std, "n": len(values)}


def method_row(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
  """Mean/std/n over a method's seeds of the end-of-run held-out Acc@k, the pool's pass rate before and after
  RL and its gain, and the per-run means of `RUN_KEYS` (records as in `summarise`)."""
  finals = [r["heldout"] for r in records if r["heldout"]]
  acc_keys = sorted({k for f in finals for k in curves.accuracies(f)})
  row: dict[str, Any] = {"seeds": len(records)}
  row.update({f"final/{k}": _mean_std([f.get(k) for f in finals]) for k in acc_keys})
  before, after = [r["precheck"] for r in records], [r["postcheck"] for r in records]
  row["pool_before"], row["pool_after"] = _mean_std(before), _mean_std(after)
  row["pool_gain"] = _mean_std([a - b for a, b in zip(after, before) if a is not None and b is not None])
  per_seed = [run_means(r["metrics"], RUN_KEYS) for r in records]
  row.update({k: _mean_std([m[k] for m in per_seed]) for k in RUN_KEYS})
  return row


def summarise(runs: Mapping[str, Sequence[Mapping[str, Any]]], reference: str, resamples: int = 1000
              ) -> dict[str, Any]:
  """The comparison of finished runs.

  Args:
    runs: method -> one record per seed: {"heldout_curve": curve, "metrics": rows, "heldout": the end-of-run
      held-out result or None, "precheck" / "postcheck": the pool's turn-1 pass rate before / after RL or None}.
    reference: the method others are divided by.
    resamples: bootstrap resamples of the seeds.

  Returns:
    {"methods": {m: `method_row`}, "reference", "heldout_ratios": `cost_ratios` of held-out Acc@1,
    "pool_ratios": `cost_ratios` of the training rollouts' turn-1 pass rate}; seconds without compilation.
  """
  heldout = {m: [without_compile(r["heldout_curve"], r["metrics"]) for r in rs] for m, rs in runs.items()}
  pool = {m: [without_compile(pool_curve(r["metrics"]), r["metrics"]) for r in rs] for m, rs in runs.items()}
  return {"methods": {m: method_row(rs) for m, rs in runs.items()}, "reference": reference,
          "heldout_ratios": cost_ratios(heldout, reference, "Acc@1", resamples),
          "pool_ratios": cost_ratios(pool, reference, POOL_KEY, resamples)}


def finite_json(value: Any) -> Any:
  """`value` with NaN and infinities as None, so that strict JSON readers accept it."""
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {k: finite_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [finite_json(v) for v in value]
  return value


def _cell(stat: Mapping[str, float], digits: int = 3) -> str:
  if not stat["n"]:
    return "-"
  return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}" if stat["n"] > 1 else f"{stat['mean']:.{digits}f}"


def _ratio_lines(title: str, ratios: Mapping[str, Any] | None, reference: str) -> list[str]:
  if ratios is None:
    return [f"{title}: no accuracy above the starting one was reached by every method, so no ratio."]
  lines = [f"{title}: cost to reach {ratios['key']} = {ratios['level']:.3f} (the highest level every method's "
           f"seed-mean curve reached), over {reference}'s; [2.5%, 97.5%] bootstrap over seeds.", "",
           "| method | seconds (no compile) | generated tokens | evaluator calls | resamples reaching |", "|---|---|---|---|---|"]
  for method, ratio in ratios["ratio"].items():
    interval = ratios["interval"][method]
    cells = [f"{ratio[k]:.2f}x" + (f" [{interval[k][0]:.2f}, {interval[k][1]:.2f}]" if interval else "")
             for k in curves.COSTS]
    lines.append(f"| {method} | {' | '.join(cells)} | {ratios['reached'][method]:.2f} |")
  return lines


def table_markdown(summary: Mapping[str, Any]) -> str:
  """The summary as markdown: per-method means ± std over seeds, then both cost-ratio tables."""
  methods = summary["methods"]
  acc_keys = sorted({k for row in methods.values() for k in row if k.startswith("final/")})
  head = ["method", "seeds", *[k.split("/", 1)[1] for k in acc_keys], "pool before", "pool after", "pool gain",
          "activated share", "groups recovered", "s/step", "learn s/step"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for method, row in methods.items():
    cells = [method, str(row["seeds"]), *[_cell(row[k]) for k in acc_keys],
             _cell(row["pool_before"]), _cell(row["pool_after"]), _cell(row["pool_gain"]),
             _cell(row["groups/activated_share"], 2), _cell(row["recovery/groups_any_fixed"], 2),
             _cell(row["time/step"], 0), _cell(row["time/learn"], 0)]
    lines.append("| " + " | ".join(cells) + " |")
  lines += [""] + _ratio_lines("Held-out", summary["heldout_ratios"], summary["reference"])
  lines += [""] + _ratio_lines("Training pool", summary["pool_ratios"], summary["reference"])
  return "\n".join(lines) + "\n"
