"""Metrics: rollout statistics, writer sinks, episode dumps, plots and the plot CLI."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from kernels_eval.schema import STATUS_CODE, STATUSES
from leap_jax.metrics import curves
from leap_jax.metrics import rollout_stats
from leap_jax.metrics.episodes import EpisodeDumper, read_episodes
from leap_jax.metrics.plots import plot_workdir
from leap_jax.metrics.writer import MetricsWriter, read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rollout():
  """P=2 groups, G=4 samples, T=3 turns. Group 0 expanded; group 1 not (only turn 1 kept)."""
  success = np.zeros((2, 4, 3), bool)
  keep = np.zeros((2, 4, 3), bool)
  keep[:, :, 0] = True
  # group 0: sample 0 passes at turn 1; sample 1 fails, passes at turn 2; samples 2, 3 fail all 3 turns.
  success[0, 0, 0] = True
  keep[0, 1:, 1] = True
  success[0, 1, 1] = True
  keep[0, 2:, 2] = True
  # group 1: every sample passes at turn 1.
  success[1, :, 0] = True
  return success, keep, np.array([True, False])


def test_cumulative_pass_rate_by_turn():
  success, keep, _ = _rollout()
  np.testing.assert_allclose(rollout_stats.cumulative_pass_rate(success, keep), [5 / 8, 6 / 8, 6 / 8])
  valid = np.ones((2, 4), bool)
  valid[1] = False
  np.testing.assert_allclose(rollout_stats.cumulative_pass_rate(success, keep, valid), [1 / 4, 2 / 4, 2 / 4])
  unkept_pass = success.copy()
  unkept_pass[0, 0, 1:] = True  # turns that were never run do not count
  unkept_pass[0, 3, 2] = True  # a kept turn-3 pass does
  np.testing.assert_allclose(rollout_stats.cumulative_pass_rate(unkept_pass, keep), [5 / 8, 6 / 8, 7 / 8])


def test_group_shares_turns_and_status_histogram():
  success, keep, active = _rollout()
  assert rollout_stats.activated_groups_share(active) == 0.5
  adv = np.zeros((2, 4, 3))
  adv[0, 0, 0] = 1.0
  adv[1, 0, 1] = 5.0  # not kept: no signal
  assert rollout_stats.signal_groups_share(adv, keep) == 0.5
  assert rollout_stats.mean_first_pass_turn(success, keep) == pytest.approx((1 + 2 + 4) / 6)
  assert rollout_stats.turns_per_pass(success, keep) == pytest.approx(keep.sum() / 6)
  assert rollout_stats.turns_per_pass(np.zeros_like(success), keep) == math.inf
  status = np.full((2, 4, 3), STATUS_CODE["compile_error"], np.int32)
  status[success] = STATUS_CODE["correct"]
  hist = rollout_stats.status_histogram(status, keep)
  assert set(hist) == set(STATUSES)
  assert hist["correct"] == 6 and hist["compile_error"] == keep.sum() - 6 and sum(hist.values()) == keep.sum()
  with pytest.raises(ValueError, match="status codes"):
    rollout_stats.status_histogram(np.full((2, 4, 3), 99), keep)


def test_rollout_metrics_bundle_and_shape_errors():
  success, keep, active = _rollout()
  rewards = np.arange(8, dtype=float).reshape(2, 4)
  adv = np.where(keep, 0.5, 0.0)
  status = np.where(success, STATUS_CODE["correct"], STATUS_CODE["wrong_output"]).astype(np.int32)
  m = rollout_stats.rollout_metrics(success, keep, active, rewards, adv, status)
  assert m["pass_rate/turn_1"] == 5 / 8 and m["pass_rate/turn_3"] == 6 / 8
  assert m["groups/activated_share"] == 0.5 and m["groups/signal_share"] == 1.0
  assert m["reward/mean"] == 3.5 and m["reward/max"] == 7.0
  assert m["advantage/mean"] == 0.5
  assert m["turns/mean"] == keep.sum() / 8
  assert m["status/correct"] == pytest.approx(6 / keep.sum())
  with pytest.raises(ValueError, match="keep has shape"):
    rollout_stats.rollout_metrics(success, keep[:, :2], active, rewards, adv, status)
  with pytest.raises(ValueError, match="active has shape"):
    rollout_stats.rollout_metrics(success, keep, active[:1], rewards, adv, status)


def test_group_recovery_counts_turn1_failures_fixed_later_in_activated_groups():
  """Two activated groups and one pruned; first-pass turns per sample (F: never):
  group 0 [1, 2, 3, F], group 1 [F, F, 1, 1] (its last sample invalid), group 2 (pruned) [F, 1, 1, 1]."""
  first = np.array([[1, 2, 3, 0], [0, 0, 1, 1], [0, 1, 1, 1]])  # 0: no pass
  success = np.stack([first == t for t in (1, 2, 3)], axis=-1)
  keep = np.ones((3, 4, 3), bool)
  keep[2, :, 1:] = False
  active = np.array([True, True, False])
  valid = np.ones((3, 4), bool)
  valid[1, 3] = False
  m = rollout_stats.group_recovery(success, keep, active, valid)
  # Turn-1 failures of activated groups: group 0 samples 1-3, group 1 samples 0-1 -> 5; fixed at 2: 1, at 3: 1.
  assert m == {"recovery/fixed_at_turn_2": 1 / 5, "recovery/fixed_at_turn_3": 1 / 5,
               "recovery/groups_any_fixed": 1 / 2}
  assert math.isnan(rollout_stats.group_recovery(success, keep, np.zeros(3, bool))["recovery/groups_any_fixed"])
  bundle = rollout_stats.rollout_metrics(success, keep, active, np.zeros((3, 4)), np.zeros((3, 4, 3)),
                                         np.zeros((3, 4, 3), np.int32), valid)
  assert bundle["recovery/groups_any_fixed"] == 1 / 2


def test_writer_jsonl_tensorboard_and_resume_overwrite(tmp_path):
  with MetricsWriter(tmp_path, total_steps=3, progress_bar=True) as w:
    w.write(1, {"loss": np.float32(0.5), "reward/mean": 0.1, "time/rollout": 2.0, "time/learner": 1.0})
    w.write(2, {"loss": 0.4, "reward/mean": float("nan"), "time/rollout": 2.5, "time/learner": 1.0})
    with pytest.raises(ValueError, match="'bad' must be a scalar"):
      w.write(3, {"bad": np.zeros(3)})
  with MetricsWriter(tmp_path, tensorboard=False, progress_bar=False) as w:  # a resumed run logs step 2 again
    w.write(2, {"loss": 0.3, "reward/mean": 0.2, "time/rollout": 2.0, "time/learner": 1.0})
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert json.loads(lines[1])["reward/mean"] is None
  records = read_metrics(tmp_path)
  assert [r["step"] for r in records] == [1, 2] and records[1]["loss"] == 0.3
  events = [f for f in os.listdir(tmp_path / "tb") if f.startswith("events.out.tfevents")]
  assert events and os.path.getsize(tmp_path / "tb" / events[0]) > 100


def test_episode_dumps(tmp_path):
  dumper = EpisodeDumper(tmp_path, every=2, max_episodes=1)
  episode = {"task_id": "relu", "turns": [{"turn": 1, "code": "def solution(x): ...", "feedback": "ok"}]}
  assert dumper.maybe_dump(1, [episode]) is None
  path = dumper.maybe_dump(2, [episode, episode])
  assert read_episodes(path) == [{"step": 2, **episode}]
  with pytest.raises(ValueError, match="turn 0 lacks \\['feedback'\\]"):
    dumper.maybe_dump(4, [{"turns": [{"code": "x"}]}])


def test_heldout_curve_costs_resume_and_the_cost_to_equal_accuracy(tmp_path):
  cost = curves.zero_cost()
  for step, acc in enumerate([0.2, 0.2, 0.4, 0.6]):
    curves.append_point(tmp_path, step, cost, {"Acc@1": acc, "Acc@3": acc + 0.1, "seconds": 99.0})
    cost = curves.add_step_cost(cost, {"time/step": 10.0, "cost/generated_tokens": 100, "cost/evaluator_calls": 4})
  curve = curves.read_curve(tmp_path)
  assert curve[2] == {"step": 2, "cumulative/seconds": 20.0, "cumulative/generated_tokens": 200.0,
                      "cumulative/evaluator_calls": 8.0, "Acc@1": 0.4, "Acc@3": 0.5}
  assert curves.cost_to_reach(curve, 0.3)["cumulative/seconds"] == 20.0 and curves.cost_to_reach(curve, 0.7) is None
  assert curves.resumed_cost([{"step": 0, **curve[3]}]) == {k: curve[3][k] for k in curves.COSTS}
  curves.start_curve(tmp_path, first_step=1)  # a run resumed at step 1 recomputes the later points
  assert [p["step"] for p in curves.read_curve(tmp_path)] == [0, 1]
  other = [{"step": s, "cumulative/seconds": 30.0 * s, "cumulative/generated_tokens": 0.0,
            "cumulative/evaluator_calls": 0.0, "Acc@1": a} for s, a in enumerate([0.2, 0.4])]
  table = curves.equal_accuracy_table({"leap": curve, "other": other})
  assert [row["level"] for row in table] == [0.2, 0.4, 0.6]
  assert table[1]["leap"]["cumulative/seconds"] == 20.0 and table[1]["other"]["cumulative/seconds"] == 30.0
  assert table[2]["other"] is None
  equal = curves.time_to_equal_accuracy({"leap": curve, "other": other}, "leap")
  assert equal["level"] == 0.4 and equal["ratio"]["other"]["cumulative/seconds"] == 1.5
  assert curves.time_to_equal_accuracy({"leap": curve[:1], "other": other[:1]}, "leap") is None


def test_plots_and_plot_cli(tmp_path):
  with MetricsWriter(tmp_path, tensorboard=False, progress_bar=False) as w:
    for step in range(1, 6):
      w.write(step, {"loss": 1.0 / step, "reward/mean": 0.1 * step, "pass_rate/turn_1": 0.1 * step,
                     "pass_rate/turn_2": 0.12 * step, "groups/activated_share": 0.4, "time/rollout": 3.0,
                     "time/learner": 1.0})
  cost = curves.zero_cost()
  for step in range(0, 6, 2):
    curves.append_point(tmp_path, step, cost, {"Acc@1": 0.1 * step, "Acc@2": 0.15 * step, "solved_by_turn": {}})
    cost = curves.add_step_cost(cost, {"time/step": 10.0, "cost/generated_tokens": 500, "cost/evaluator_calls": 8})
  paths = plot_workdir(tmp_path)
  names = sorted(os.path.basename(p) for p in paths)
  assert names == ["activated_groups.png", "heldout_vs_cost.png", "loss.png", "pass_rate.png", "reward.png",
                   "step_time.png"]
  for p in paths:
    assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
  out = tmp_path / "cli"
  proc = subprocess.run([sys.executable, os.path.join(REPO, "launch", "plot.py"), str(tmp_path), "--out", str(out)],
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert sorted(os.listdir(out)) == names
