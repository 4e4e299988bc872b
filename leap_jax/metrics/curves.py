"""Held-out accuracy against training cost: the curve a run records and what it says about equal accuracy.

A run with `heldout.every = N` appends one point to `<workdir>/heldout_curve.jsonl` before the first step and
every N steps: {"step", "cumulative/seconds", "cumulative/generated_tokens", "cumulative/evaluator_calls",
"Acc@1", ..., "Acc@T"}. The costs are the training rollouts' and updates' (`COSTS`; held-out evaluations
themselves are not counted), summed from step 0 and carried across a resume through `metrics.jsonl`.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any, Sequence

CURVE_FILE = "heldout_curve.jsonl"
# Cumulative cost -> the per-step metric it sums.
COSTS = {"cumulative/seconds": "time/step", "cumulative/generated_tokens": "cost/generated_tokens",
         "cumulative/evaluator_calls": "cost/evaluator_calls"}


def zero_cost() -> dict[str, float]:
  return {k: 0.0 for k in COSTS}


def add_step_cost(cost: dict[str, float], metrics: dict[str, float]) -> dict[str, float]:
  """cost + this step's: c_k(s) = c_k(s - 1) + metrics[COSTS[k]]."""
  return {k: cost[k] + float(metrics.get(step_key, 0.0)) for k, step_key in COSTS.items()}


def costs_of(row: dict[str, Any]) -> dict[str, float]:
  """The cumulative costs (`COSTS`) a metrics row or curve point holds."""
  return {k: float(row[k]) for k in COSTS}


def resumed_cost(history: Sequence[dict[str, Any]]) -> dict[str, float]:
  """The cumulative cost recorded by the last step of a run's metrics (zero for a fresh run)."""
  for row in reversed(history):
    if all(k in row for k in COSTS):
      return costs_of(row)
  return zero_cost()


def accuracies(result: dict[str, Any]) -> dict[str, float]:
  """The Acc@k entries of a held-out result (which also holds per-task turns and timings)."""
  return {k: v for k, v in result.items() if k.startswith("Acc@")}


def read_curve(workdir: str | os.PathLike) -> list[dict[str, Any]]:
  path = pathlib.Path(workdir) / CURVE_FILE
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def start_curve(workdir: str | os.PathLike, first_step: int) -> None:
  """Keeps only points up to `first_step` (a resumed run recomputes the later ones)."""
  kept = [p for p in read_curve(workdir) if p["step"] <= first_step]
  path = pathlib.Path(workdir) / CURVE_FILE
  path.write_text("".join(json.dumps(p) + "\n" for p in kept))


def append_point(workdir: str | os.PathLike, step: int, cost: dict[str, float],
                 accuracy: dict[str, Any]) -> dict[str, Any]:
  point = {"step": step, **cost, **accuracies(accuracy)}
  with open(pathlib.Path(workdir) / CURVE_FILE, "a") as f:
    f.write(json.dumps(point) + "\n")
  return point


def cost_to_reach(curve: Sequence[dict[str, Any]], level: float, key: str = "Acc@1") -> dict[str, float] | None:
  """The cumulative costs (and step) at the first point whose `key` is at least `level`; None if never."""
  for point in curve:
    if point.get(key, -math.inf) >= level - 1e-12:
      return {"step": point["step"], **costs_of(point)}
  return None


def equal_accuracy_table(curves: dict[str, Sequence[dict[str, Any]]], key: str = "Acc@1") -> list[dict[str, Any]]:
  """For each accuracy level any run reached (sorted), each run's cost to reach it first (None: never).

  Returns rows {"level", "<run>": cost_to_reach(...) | None}; a level every run reached answers "at what
  cost did each get there", i.e. the time to equal accuracy.
  """
  levels = sorted({p[key] for curve in curves.values() for p in curve if key in p})
  return [{"level": level, **{name: cost_to_reach(curve, level, key) for name, curve in curves.items()}}
          for level in levels]


def time_to_equal_accuracy(curves: dict[str, Sequence[dict[str, Any]]], reference: str,
                           key: str = "Acc@1") -> dict[str, Any] | None:
  """At the highest level every run reached: each run's cumulative cost over `reference`'s ("1.93x faster" is
  other / reference of seconds). None when that level is where the runs started (no run improved on it).

  Returns {"level", "cost": {run: cost_to_reach}, "ratio": {run: {cost key: run's / reference's}}}.
  """
  common = [row for row in equal_accuracy_table(curves, key) if all(row[name] is not None for name in curves)]
  if not common or common[-1][reference]["step"] == 0:
    return None
  row = common[-1]
  base = row[reference]
  ratio = {name: {k: row[name][k] / base[k] if base[k] else math.inf for k in COSTS} for name in curves}
  return {"level": row["level"], "cost": {name: row[name] for name in curves}, "ratio": ratio}
