"""launch/compare_methods.py end to end on the tiny smoke config: one SFT for all runs, each (method, seed) in
its own workdir, finished runs skipped on a rerun, the table, JSON and plots written."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from launch import compare_methods

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
OVERRIDES = ["--config", "configs/smoke.py", "--config.steps=2", "--config.heldout.every=2",
             "--config.heldout.at_end=True", "--config.heldout.levels=(0,)", "--config.sft.enabled=True",
             "--config.sft.steps=1", "--config.precheck.enabled=True"]


def _run(out, *args):
  return subprocess.run([sys.executable, "launch/compare_methods.py", *OVERRIDES, f"--out={out}", *args],
                        cwd=REPO_ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})


def test_bad_runner_arguments_are_named():
  with pytest.raises(SystemExit, match="unknown methods \\['nope'\\]"):
    compare_methods.parse(["compare_methods.py", "--methods=leap,nope", *OVERRIDES])
  with pytest.raises(SystemExit, match="--reference 'grpo' is not one of"):
    compare_methods.parse(["compare_methods.py", "--methods=leap", "--reference=grpo", *OVERRIDES])


@pytest.mark.slow
def test_runs_share_one_sft_and_a_rerun_skips_finished_runs(tmp_path):
  out = tmp_path / "compare"
  first = _run(out, "--methods=leap,grpo", "--seeds=3", "--resamples=20")
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
  assert (out / "sft" / "config.json").is_file()
  for method in ("leap", "grpo"):
    workdir = out / method / "seed3"
    record = json.loads((workdir / "run_record.json").read_text())
    assert record["config"]["method"] == method and record["config"]["seed"] == 3
    assert record["config"]["sft"]["checkpoint_dir"] == str(out / "sft")
    assert (workdir / "heldout.json").exists() and (workdir / "train.log").exists()
  summary = json.loads((out / "comparison.json").read_text())
  assert set(summary["methods"]) == {"leap", "grpo"} and summary["methods"]["leap"]["seeds"] == 1
  assert summary["methods"]["grpo"]["pool_before"]["n"] == 1
  table = (out / "comparison.md").read_text()
  assert table.startswith("| method | seeds | Acc@1 | Acc@2 |") and "| leap | 1 |" in table
  assert (out / "plots" / "pool_vs_cost.png").exists()
  curve = (out / "leap" / "seed3" / "heldout_curve.jsonl").read_text().splitlines()
  assert [json.loads(line)["step"] for line in curve] == [0, 2]
  stamps = [(out / "leap" / "seed3" / "metrics.jsonl").stat().st_mtime_ns, (out / "sft.log").stat().st_mtime_ns]
  second = _run(out, "--methods=leap,grpo", "--seeds=3", "--resamples=20")
  assert second.returncode == 0, second.stderr[-3000:]
  assert "leap seed 3: finished, skipped" in second.stdout and "grpo seed 3: finished, skipped" in second.stdout
  assert "SFT once" not in second.stdout
  assert [(out / "leap" / "seed3" / "metrics.jsonl").stat().st_mtime_ns, (out / "sft.log").stat().st_mtime_ns] == stamps


def test_pool_rates_measures_every_pool_task(tmp_path):
  proc = subprocess.run([sys.executable, "launch/pool_rates.py", "--config", "configs/smoke.py",
                         f"--config.workdir={tmp_path}", "--config.precheck.samples_per_task=2"],
                        cwd=REPO_ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads((tmp_path / "pool_rates.json").read_text())
  pool = sorted(p.stem for p in (REPO_ROOT / "kernels_eval" / "tasks" / "level0").glob("*.py")
                if 'SPLIT = "train"' in p.read_text())
  assert sorted(result["per_task"]) == pool and result["step"] == 0
  assert all(r in (0.0, 0.5, 1.0) for r in result["per_task"].values())  # 2 samples per task
  assert "pool pass rate" in proc.stdout
