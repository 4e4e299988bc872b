"""Methods over seeds: mean curves, spread, and the bootstrap of cost to reach equal accuracy."""
import math

import numpy as np
import pytest

from leap_jax.metrics import comparison


def _curve(accs, seconds_per_step, tokens_per_step=100.0, calls_per_step=10.0):
  return [{"step": s, "cumulative/seconds": s * seconds_per_step, "cumulative/generated_tokens": s * tokens_per_step,
           "cumulative/evaluator_calls": s * calls_per_step, "Acc@1": a, "solved_by_turn": {}}
          for s, a in enumerate(accs)]


def test_mean_curve_and_spread_over_common_steps():
  a, b = _curve([0.0, 0.5, 1.0], 10.0), _curve([0.2, 0.3], 20.0)
  mean = comparison.mean_curve([a, b])
  assert [p["step"] for p in mean] == [0, 1]  # step 2 only in one run
  assert mean[1]["Acc@1"] == pytest.approx(0.4) and mean[1]["cumulative/seconds"] == pytest.approx(15.0)
  assert "solved_by_turn" not in mean[0]
  s = comparison.spread([a, b], "Acc@1")
  np.testing.assert_allclose(s["std"], [0.2 / np.sqrt(2), 0.2 / np.sqrt(2)])  # ddof 1
  np.testing.assert_allclose(s["min"], [0.0, 0.3])


def test_cost_ratios_are_each_over_the_reference_and_the_interval_holds_them():
  """Seed means: leap 0, 0.5, 0.5 at 10 s per step; grpo_mt 0, 0.2, 0.5 at 15 s per step. Both reach 0.5, leap
  at step 1 (10 s), grpo_mt at step 2 (30 s): 3x the seconds, 2x the tokens. In every resample where both reach
  0.5 they do so at those steps; the others (e.g. leap's third seed thrice) count as inf."""
  runs = {"leap": [_curve([0.0, 0.5, 0.5], 10.0), _curve([0.0, 0.6, 0.6], 10.0), _curve([0.0, 0.4, 0.4], 10.0)],
          "grpo_mt": [_curve([0.0, 0.2, 0.5], 15.0), _curve([0.0, 0.3, 0.6], 15.0), _curve([0.0, 0.1, 0.4], 15.0)]}
  out = comparison.cost_ratios(runs, "leap", resamples=200)
  assert out["level"] == pytest.approx(0.5) and out["seeds"] == {"leap": 3, "grpo_mt": 3}
  assert out["ratio"]["grpo_mt"]["cumulative/seconds"] == pytest.approx(3.0)
  assert out["ratio"]["grpo_mt"]["cumulative/generated_tokens"] == pytest.approx(2.0)
  assert out["ratio"]["leap"]["cumulative/seconds"] == 1.0
  assert out["interval"]["grpo_mt"]["cumulative/seconds"] == [3.0, math.inf]
  assert 0.5 < out["reached"]["grpo_mt"] < 0.75  # paired draws: both reach 0.5 in 17 of 27 equally likely ones


def test_bootstrap_pairs_the_methods_seeds():
  """Two methods with the same runs: seed i of each shares its start, so every paired resample gives 1x. Drawn
  apart, a resample could pair leap's second seed (at 1.0 from step 0, cost 0) with grpo's first (10 s)."""
  runs = [_curve([0.0, 1.0, 1.0], 10.0), _curve([1.0, 1.0, 1.0], 10.0)]
  out = comparison.cost_ratios({"leap": runs, "grpo": list(runs)}, "leap", resamples=200)
  assert out["interval"]["grpo"]["cumulative/seconds"] == [1.0, 1.0] and out["reached"]["grpo"] == 1.0


def test_no_ratio_when_nothing_improved():
  runs = {"leap": [_curve([0.5, 0.5], 1.0)], "grpo": [_curve([0.5, 0.4], 1.0)]}
  assert comparison.cost_ratios(runs, "leap", resamples=10) is None


def test_run_means_skip_missing_and_nan():
  rows = [{"groups/activated_share": 0.5, "recovery/groups_any_fixed": math.nan},
          {"groups/activated_share": 1.0, "recovery/groups_any_fixed": 0.25}]
  out = comparison.run_means(rows, ["groups/activated_share", "recovery/groups_any_fixed", "absent"])
  assert out["groups/activated_share"] == 0.75 and out["recovery/groups_any_fixed"] == 0.25
  assert math.isnan(out["absent"])


def _rows(pass_rates, step_seconds=10.0, compile_first=5.0):
  rows, cum = [], {"cumulative/seconds": 0.0, "cumulative/generated_tokens": 0.0, "cumulative/evaluator_calls": 0.0}
  for s, rate in enumerate(pass_rates):
    own = {"time/step": step_seconds + (compile_first if s == 0 else 0.0), "cost/generated_tokens": 50.0,
           "cost/evaluator_calls": 4.0, "time/compile": compile_first if s == 0 else 0.0}
    cum = {"cumulative/seconds": cum["cumulative/seconds"] + own["time/step"],
           "cumulative/generated_tokens": cum["cumulative/generated_tokens"] + 50.0,
           "cumulative/evaluator_calls": cum["cumulative/evaluator_calls"] + 4.0}
    rows.append({"step": s, **own, **cum, "pass_rate/turn_1": rate, "groups/activated_share": 0.5})
  return rows


def test_pool_curve_points_are_policies_with_the_cost_that_made_them():
  """Row s measured the policy after s updates: its point is step s at the cost of steps 0..s-1."""
  curve = comparison.pool_curve(_rows([0.25, math.nan, 0.75]))
  assert [p["step"] for p in curve] == [0, 2]  # the NaN row is left out
  assert curve[0]["cumulative/seconds"] == 0.0 and curve[0]["cumulative/generated_tokens"] == 0.0
  assert curve[1]["cumulative/seconds"] == 25.0 and curve[1]["cumulative/evaluator_calls"] == 8.0
  free = comparison.without_compile(curve, _rows([0.25, math.nan, 0.75]))
  assert [p["cumulative/seconds"] for p in free] == [0.0, 20.0]


def test_summary_and_table():
  heldout = lambda accs: [{"step": 2 * i, "cumulative/seconds": 25.0 * i, "cumulative/generated_tokens": 100.0 * i,
                           "cumulative/evaluator_calls": 8.0 * i, "Acc@1": a, "Acc@2": a} for i, a in enumerate(accs)]
  record = lambda accs, rates, before, after: {"heldout_curve": heldout(accs), "metrics": _rows(rates),
                                               "heldout": {"Acc@1": accs[-1], "Acc@2": accs[-1], "seconds": 3.0},
                                               "precheck": before, "postcheck": after}
  runs = {"leap": [record([0.5, 0.75], [0.2, 0.6, 0.8], 0.25, 0.5), record([0.5, 1.0], [0.3, 0.7, 0.9], 0.25, 0.75)],
          "grpo": [record([0.5, 0.5], [0.2, 0.2, 0.4], 0.25, 0.25), record([0.5, 0.5], [0.3, 0.3, 0.5], 0.25, None)]}
  summary = comparison.summarise(runs, "leap", resamples=50)
  leap = summary["methods"]["leap"]
  assert leap["seeds"] == 2 and leap["final/Acc@1"]["mean"] == pytest.approx(0.875)
  assert leap["pool_gain"] == {"mean": 0.375, "std": pytest.approx(math.sqrt(2) * 0.125), "n": 2}
  assert summary["methods"]["grpo"]["pool_gain"]["n"] == 1 and summary["heldout_ratios"] is None
  pool = summary["pool_ratios"]
  assert pool["level"] == pytest.approx(0.45)  # grpo's mean curve tops out at 0.45, leap's passes it at step 1
  assert pool["ratio"]["grpo"]["cumulative/seconds"] == pytest.approx(2.0)  # 20 s (no compile) over 10 s
  table = comparison.table_markdown(summary)
  assert "| leap | 2 | 0.875 ± 0.177 | 0.875 ± 0.177 | 0.250 ± 0.000 | 0.625 ± 0.177 |" in table
  assert "Held-out: no accuracy above the starting one" in table and "| grpo | 2.00x [" in table
