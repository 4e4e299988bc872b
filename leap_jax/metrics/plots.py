"""PNG curves of a workdir's `metrics.jsonl` and `heldout_curve.jsonl` (matplotlib, Agg backend)."""
from __future__ import annotations

import os
import re
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after selecting the backend)
import numpy as np  # noqa: E402

from leap_jax.metrics import comparison  # noqa: E402
from leap_jax.metrics import curves  # noqa: E402
from leap_jax.metrics.writer import read_metrics  # noqa: E402

PLOTS_DIR = "plots"


def _series(records: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
  pairs = [(r["step"], r[key]) for r in records if key in r]
  steps = np.array([p[0] for p in pairs], float)
  values = np.array([p[1] for p in pairs], float)
  return steps, values


def _keys(records: list[dict], pattern: str) -> list[str]:
  found = {k for r in records for k in r if re.fullmatch(pattern, k)}
  return sorted(found, key=lambda k: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", k)])


def _line_plot(records, keys, title, ylabel, path) -> Optional[str]:
  keys = [k for k in keys if np.isfinite(_series(records, k)[1]).any()]
  if not keys:
    return None
  fig, ax = plt.subplots(figsize=(7, 4))
  for key in keys:
    ax.plot(*_series(records, key), label=key, marker="." if len(records) < 30 else None)
  ax.set(title=title, xlabel="step", ylabel=ylabel)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def _time_split(records, path) -> Optional[str]:
  keys = [k for k in _keys(records, r"time/.+") if k != "time/step"]
  rows = [r for r in records if all(k in r for k in keys)]
  if not keys or not rows:
    return None
  steps = np.array([r["step"] for r in rows], float)
  stack = np.nan_to_num(np.array([[r[k] for r in rows] for k in keys], float))
  fig, ax = plt.subplots(figsize=(7, 4))
  ax.stackplot(steps, stack, labels=keys)
  ax.set(title="step time split", xlabel="step", ylabel="seconds")
  ax.legend(fontsize=8, loc="upper left")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def _accuracy_against_cost(curve, path) -> Optional[str]:
  """Held-out Acc@k against each cumulative cost of training (seconds, generated tokens, evaluator calls)."""
  keys = _keys(curve, r"Acc@\d+")
  if len(curve) < 2 or not keys:
    return None
  fig, axes = plt.subplots(1, len(curves.COSTS), figsize=(12, 3.6), sharey=True)
  for ax, cost in zip(axes, curves.COSTS):
    for key in keys:
      ax.plot([p[cost] for p in curve], [p[key] for p in curve], marker=".", label=key)
    ax.set(xlabel=cost.split("/")[1].replace("_", " "))
    ax.grid(alpha=0.3)
  axes[0].set(ylabel="held-out accuracy")
  axes[0].legend(fontsize=8)
  fig.suptitle("held-out accuracy against training cost")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def plot_workdir(workdir: str | os.PathLike, out_dir: Optional[str] = None) -> list[str]:
  """Writes the main curves as PNGs into `out_dir` (default `<workdir>/plots`); returns the paths written.

  Curves (each only when its metrics exist): pass rate by turn (pass_rate/turn_<k>), reward (reward/mean),
  loss, activated-groups share (groups/activated_share, groups/signal_share), step-time split (time/<phase>),
  and held-out accuracy against training cost (`heldout_curve.jsonl`, `curves`).
  """
  records = read_metrics(workdir)
  out_dir = os.path.join(os.fspath(workdir), PLOTS_DIR) if out_dir is None else out_dir
  os.makedirs(out_dir, exist_ok=True)
  at = lambda name: os.path.join(out_dir, name)
  written = [
      _line_plot(records, _keys(records, r"pass_rate/turn_\d+"), "cumulative pass rate by turn", "share",
                 at("pass_rate.png")),
      _line_plot(records, ["reward/mean"], "reward", "mean reward", at("reward.png")),
      _line_plot(records, ["loss", "pg_loss"], "loss", "loss", at("loss.png")),
      _line_plot(records, ["groups/activated_share", "groups/signal_share"], "groups", "share of groups",
                 at("activated_groups.png")),
      _time_split(records, at("step_time.png")),
      _accuracy_against_cost(curves.read_curve(workdir), at("heldout_vs_cost.png")),
  ]
  return [p for p in written if p is not None]


def methods_against_cost(runs: dict[str, list], key: str, title: str, path: str) -> Optional[str]:
  """`key` against each cumulative cost, one line per method (the seed mean) with its min-max band over seeds.

  Args:
    runs: method -> its seeds' curves (lists of points with "step", the `curves.COSTS` keys and `key`).
  """
  runs = {m: r for m, r in runs.items() if r and len(comparison.common_steps(r)) >= 2}
  if not runs:
    return None
  fig, axes = plt.subplots(1, len(curves.COSTS), figsize=(13, 3.8), sharey=True)
  for ax, cost in zip(axes, curves.COSTS):
    for method, seeds in runs.items():
      x = comparison.spread(seeds, cost)["mean"]
      y = comparison.spread(seeds, key)
      line, = ax.plot(x, y["mean"], marker=".", label=f"{method} ({len(seeds)} seeds)")
      ax.fill_between(x, y["min"], y["max"], color=line.get_color(), alpha=0.15)
    ax.set(xlabel=cost.split("/")[1].replace("_", " "))
    ax.grid(alpha=0.3)
  axes[0].set(ylabel=key)
  axes[0].legend(fontsize=8)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
