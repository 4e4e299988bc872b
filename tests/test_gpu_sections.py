"""The learner's GPU section: dry run, deadline, MFU formula, no recompiles (imports: tests/test_gpu_check.py)."""
import json
import time

import jax
import numpy as np
import pytest
from flax import nnx

from configs import common
from leap_jax.models import ModelConfig, Transformer
from leap_jax.sampling.gpu_section import section_device
from leap_jax.train import gpu_section
from leap_jax.train import learner as learner_lib
from leap_jax.train import optim
from leap_jax.train.config import from_mapping

def _written(tmp_path) -> dict:
  return json.loads((tmp_path / "gpu_learner.json").read_text())


def test_model_shape_and_cpu_report(tmp_path, capsys):
  """The section's model is Qwen2.5-1.5B-sized (1.54B parameters); without a GPU it reports not_run."""
  cfg = ModelConfig.from_hf_config(gpu_section.QWEN25_1P5B, dtype="bfloat16", param_dtype="bfloat16")
  abstract = nnx.state(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
  assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract)) == pytest.approx(1.54e9, rel=0.01)
  if section_device(dry_run=False) is not None:
    pytest.skip("a GPU is present: see test_qwen_shaped_step")
  assert gpu_section.run(str(tmp_path)) == {"status": "not_run", "reason": "no GPU"} == _written(tmp_path)
  assert "not_run: no GPU" in capsys.readouterr().out


def test_defaults_match_the_training_configs():
  """OptimConfig() and LearnerConfig() (the section's defaults) are configs/common's optim and learner sections."""
  assert optim.OptimConfig() == from_mapping(optim.OptimConfig, common.optim().to_dict())
  assert learner_lib.LearnerConfig() == from_mapping(learner_lib.LearnerConfig, common.learner().to_dict())


def test_model_flops_formula():
  cfg = ModelConfig.from_hf_config(gpu_section.TINY)
  n = gpu_section.flop_params(cfg, 1000)
  assert n == 1000  # tied: the embedding table is the output projection, counted once
  tokens = 3 * 32
  assert gpu_section.model_flops(cfg, n, 3, 32) == 6 * n * tokens + 12 * 2 * 4 * 16 * 32 * tokens
  untied = ModelConfig.from_hf_config({**gpu_section.TINY, "tie_word_embeddings": False})
  assert gpu_section.flop_params(untied, 1000 + 256 * 64) == 1000


def test_dry_run_times_steady_steps_without_recompiling(tmp_path):
  result = gpu_section.run(str(tmp_path), dry_run=True)
  assert result == _written(tmp_path) and result["status"] == "dry_run", result
  for layout in gpu_section.LAYOUTS:
    first, steps = result[f"{layout}_first_step"], result[f"{layout}_steps"]
    assert first["compiles"] >= 1 and first["compile_s"] > 0  # the listener sees the step's compile ...
    assert steps["recompiles"] == 0 and steps["steps"] == 2  # ... and none during the timed steps
    assert steps["tokens_per_s"] > 0 and steps["model_tflops"] > 0 and result["matmul"]["tflops"] > 0
    assert steps["mfu_measured"] == pytest.approx(steps["model_tflops"] / result["matmul"]["tflops"])
    assert np.isfinite(steps["loss"]) and steps["grad_norm"] > 0
  # Same batch, same parameters: the two layouts compute the same first loss on fewer positions.
  assert result["shared_prefix_first_step"]["loss"] == pytest.approx(result["per_episode_first_step"]["loss"],
                                                                     rel=1e-4)
  assert result["shared_prefix_steps"]["positions"] < result["per_episode_steps"]["positions"]
  assert result["shared_prefix_speedup"] > 0


def test_layout_flops_count_what_the_shared_prefix_layout_computes():
  cfg = ModelConfig.from_hf_config(gpu_section.TINY)
  attention = 12 * 2 * 4 * 16
  assert gpu_section.layout_flops(cfg, 1000, 2, 3, 8, 4) == 6 * 1000 * 2 * (8 + 12) + attention * 2 * (64 + 12 * 12)
  # One unit of one row with no prefix is the per-episode count of that row.
  assert gpu_section.layout_flops(cfg, 1000, 1, 1, 0, 32) == gpu_section.model_flops(cfg, 1000, 1, 32)


def test_past_deadline_skips_every_measurement(tmp_path):
  result = gpu_section.run(str(tmp_path), deadline=time.monotonic() - 1, dry_run=True)
  assert result == _written(tmp_path) and result["status"] == "dry_run"
  keys = ["matmul"] + [f"{layout}_{part}" for layout in gpu_section.LAYOUTS for part in ("first_step", "steps")]
  assert all(result[key] == {"skipped": "time budget"} for key in keys)


def test_a_failed_first_step_is_recorded_and_skips_the_timed_steps(tmp_path, monkeypatch):
  def fail(self):
    raise MemoryError("out of device memory")
  monkeypatch.setattr(gpu_section._Bench, "first_step", fail)  # pylint: disable=protected-access
  result = gpu_section.run(str(tmp_path), dry_run=True)
  assert result == _written(tmp_path) and result["status"] == "error" and result["matmul"]["tflops"] > 0
  assert "out of device memory" in result["per_episode_first_step"]["error"]
  assert result["per_episode_steps"] == {"skipped": "first step failed"}


@pytest.mark.gpu
def test_qwen_shaped_step(tmp_path):
  result = gpu_section.run(str(tmp_path))
  assert result["status"] == "ok", result
  for layout in gpu_section.LAYOUTS:
    steps = result[f"{layout}_steps"]
    assert steps["recompiles"] == 0 and steps["tokens_per_s"] > 0 and steps["peak_memory_gib"] > 0
    assert 0 < steps["mfu_datasheet"] < 1 and np.isfinite(steps["loss"])
