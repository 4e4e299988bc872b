"""The sampler's GPU section: not_run on CPU, every code path in a dry run, deadline, partial results."""
import json
import time

import jax
import pytest

from leap_jax.sampling import gpu_section

MEASUREMENTS = ("copy", "model", "prefill", "decode_batch_2")
TIMED = ("copy", "prefill", "decode_batch_2")


def _written(tmp_path) -> dict:
  return json.loads((tmp_path / "gpu_sampler.json").read_text())


@pytest.mark.skipif(gpu_section.section_device(dry_run=False) is not None, reason="checks the answer without a GPU")
def test_reports_not_run_without_gpu(tmp_path):
  assert gpu_section.run(tmp_path) == {"status": "not_run: no GPU", "backend": "cpu"} == _written(tmp_path)


def test_dry_run_measures_everything_on_tiny_shapes(tmp_path):
  result = gpu_section.run(tmp_path, dry_run=True)
  assert result == _written(tmp_path)
  assert result["status"] == "dry_run" and result["copy_gb_per_s"] == result["copy"]["gb_per_s"] > 0
  assert result["prefill"]["tokens_per_s"] > 0
  assert result["model"]["params"] > 0 and result["model"]["init_s"] > 0
  for key in TIMED:
    assert result[key]["recompiles"] == 0 and result[key]["compile_s"] >= 0, result[key]
  decode = result["decode_batch_2"]
  assert decode["tokens_per_s"] > 0 and decode["gb_per_s"] > 0
  assert decode["fraction_of_copy"] == pytest.approx(decode["gb_per_s"] / result["copy_gb_per_s"])
  assert decode["compile_s"] > 0  # the decode's first call compiles, and the listener sees it
  if result["peak_hbm_bytes_per_s"] is None:
    assert decode["hbm_fraction"] is None


def test_past_deadline_skips_every_measurement(tmp_path):
  result = gpu_section.run(tmp_path, deadline=time.monotonic() - 1, dry_run=True)
  assert result == _written(tmp_path) and result["status"] == "dry_run"
  assert all(result[key] == {"skipped": "time budget"} for key in MEASUREMENTS)


def test_a_failing_measurement_is_recorded_and_the_rest_still_run(tmp_path, monkeypatch):
  def fail(*args):
    raise RuntimeError("prefill exploded")
  monkeypatch.setattr(gpu_section, "_prefill_entry", fail)
  result = gpu_section.run(tmp_path, dry_run=True)
  assert result == _written(tmp_path) and result["status"] == "error"
  assert "prefill exploded" in result["prefill"]["error"]
  assert result["copy"]["gb_per_s"] > 0 and result["decode_batch_2"]["tokens_per_s"] > 0


def test_decode_bytes_read_the_cache_up_to_its_current_length():
  # T = 3 new tokens after P = 4: two model steps, reading 5 and 6 cached positions per row.
  assert gpu_section.decode_bytes(100, 10, rows=2, prompt_len=4, new_tokens=3) == 2 * 100 + 2 * 10 * (5 + 6)


def test_compile_watch_counts_compilations():
  fn, x = jax.jit(lambda x: x * 3 + 1), jax.numpy.arange(7.0)
  with gpu_section.CompileWatch() as first:
    jax.block_until_ready(fn(x))
  with gpu_section.CompileWatch() as again:
    jax.block_until_ready(fn(x))
  assert first.compiles == 1 and first.seconds > 0 and again.compiles == 0


@pytest.mark.gpu
def test_qwen_shaped_figures(tmp_path):
  result = gpu_section.run(tmp_path)
  assert result["status"] == "ok", result
  assert result["decode_batch_64"]["tokens_per_s"] > result["decode_batch_1"]["tokens_per_s"]
  assert 0 < result["decode_batch_1"]["fraction_of_copy"] < 1.2
