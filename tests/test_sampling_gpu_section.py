"""The GPU figures script: reports not_run on CPU, and its measuring path runs on a tiny model."""
import json

import jax
import pytest

from leap_jax.sampling import gpu_section

TINY = dict(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=8, qkv_bias=True, tie_word_embeddings=True, dtype="bfloat16",
            param_dtype="bfloat16")


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU answer")
def test_reports_not_run_without_gpu(tmp_path):
  assert gpu_section.run(tmp_path) == {"status": "not_run: no GPU", "backend": "cpu"}


def test_measuring_path_on_tiny_model(tmp_path):
  result = gpu_section.run(tmp_path, prefill_batch=2, prefill_len=14, prompt_len=8, new_tokens=6,
                           decode_batches=(2,), model=TINY, require_gpu=False)
  assert result == json.loads((tmp_path / "sampler_gpu.json").read_text())
  assert result["status"] == "ok" and result["prefill"]["tokens_per_s"] > 0
  entry = result["decode_batch_2"]
  assert entry["batch"] == 2 and entry["tokens_per_s"] > 0 and entry["hbm_bytes_per_s"] > 0
  assert "hbm_fraction" not in entry  # no known peak bandwidth for a CPU


@pytest.mark.gpu
def test_qwen_shaped_figures(tmp_path):
  result = gpu_section.run(tmp_path)
  assert result["decode_batch_64"]["tokens_per_s"] > result["decode_batch_1"]["tokens_per_s"]
