"""Parity with transformers on tiny random LLaMA / Qwen2 checkpoints, and HF export round trips."""
import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from tokenizers import Tokenizer, models, pre_tokenizers

from leap_jax.models import ModelConfig, load_hf_checkpoint, load_pretrained, save_hf_checkpoint

WORDS = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(60)]


def tiny_tokenizer():
  vocab = {w: i for i, w in enumerate(WORDS)}
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                              pad_token="<pad>", unk_token="<unk>")


COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
VARIANTS = {
    "llama_bias_untied": lambda: transformers.LlamaConfig(
        **COMMON, attention_bias=True, tie_word_embeddings=False, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 300.0}),
    "llama3_rope_tied": lambda: transformers.LlamaConfig(
        **COMMON, tie_word_embeddings=True, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "qwen2_tied": lambda: transformers.Qwen2Config(
        **COMMON, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
}


def hf_model(hf_config):
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(hf_config).float().eval()
  with torch.no_grad():  # Random biases and norm scales, so every parameter matters.
    for name, p in model.named_parameters():
      if name.endswith("bias") or "norm" in name:
        p.add_(0.2 * torch.randn_like(p))
  return model


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def checkpoint(request, tmp_path_factory):
  path = tmp_path_factory.mktemp(request.param)
  model = hf_model(VARIANTS[request.param]())
  # Shard the weights to exercise the index file.
  model.save_pretrained(path, max_shard_size="40KB")
  tiny_tokenizer().save_pretrained(path)
  return request.param, path, model


TOKENS = np.random.default_rng(0).integers(0, 64, (2, 11))


def torch_forward(model, tokens):
  with torch.no_grad():
    out = model(torch.tensor(tokens), output_hidden_states=True)
  return out.logits.numpy(), np.stack([h.numpy() for h in out.hidden_states])


def jax_forward(model, tokens, hidden_layers=()):
  positions = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
  return model(jnp.asarray(tokens, jnp.int32), jnp.asarray(positions, jnp.int32), hidden_layers=hidden_layers)


def test_logits_and_hidden_states_match_transformers(checkpoint):
  name, path, hf = checkpoint
  assert json.load(open(path / "model.safetensors.index.json"))["weight_map"]
  model, tokenizer = load_hf_checkpoint(path, dtype="float32")
  assert model.config.tie_word_embeddings == hf.config.tie_word_embeddings
  assert tokenizer.eos_token_id == 2 and tokenizer("w0 w1")["input_ids"][-2:] == [4, 5]
  want_logits, want_hidden = torch_forward(hf, TOKENS)
  out = jax_forward(model, TOKENS, hidden_layers=tuple(range(4)))
  np.testing.assert_allclose(out.logits, want_logits, atol=1e-4, rtol=0)
  # HF's last hidden state is after the final norm; the others are raw residual streams.
  np.testing.assert_allclose(out.hidden[:3], want_hidden[:3], atol=1e-4, rtol=0)
  np.testing.assert_allclose(out.final_hidden, want_hidden[3], atol=1e-4, rtol=0)
  if name == "llama3_rope_tied":
    assert dict(model.config.rope_scaling)["rope_type"] == "llama3"


def test_unscanned_load_matches(checkpoint):
  _, path, hf = checkpoint
  model, _ = load_hf_checkpoint(path, scan_layers=False)
  np.testing.assert_allclose(jax_forward(model, TOKENS).logits, torch_forward(hf, TOKENS)[0], atol=1e-4)


def test_export_round_trip(checkpoint, tmp_path):
  _, path, hf = checkpoint
  model, tokenizer = load_hf_checkpoint(path)
  save_hf_checkpoint(model, tokenizer, tmp_path / "a")
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "a", dtype=torch.float32).eval()
  np.testing.assert_allclose(torch_forward(reloaded, TOKENS)[0], torch_forward(hf, TOKENS)[0], atol=1e-5)
  assert transformers.PreTrainedTokenizerFast.from_pretrained(tmp_path / "a")("w3")["input_ids"][-1] == 7
  # Our own loader reads sharded exports too.
  save_hf_checkpoint(model, None, tmp_path / "b", max_shard_bytes=30_000)
  assert (tmp_path / "b" / "model.safetensors.index.json").exists()
  again = ModelConfig.from_hf_config(tmp_path / "b")
  assert again == model.config
  reread, _ = load_pretrained(str(tmp_path / "a"))
  np.testing.assert_array_equal(jax_forward(reread, TOKENS).logits, jax_forward(model, TOKENS).logits)


def test_config_dtypes_and_bias_flags():
  cfg = ModelConfig.from_hf_config(VARIANTS["qwen2_tied"]().to_dict(), dtype="bfloat16", param_dtype="bfloat16")
  assert cfg.compute_dtype == jnp.bfloat16 and cfg.qkv_bias and not cfg.o_bias
  cfg = ModelConfig.from_hf_config(VARIANTS["llama_bias_untied"]().to_dict(), remat="full", scan_layers=False)
  assert cfg.qkv_bias and cfg.o_bias and cfg.rope_theta == 300.0 and cfg.remat == "full"
  with pytest.raises(ValueError, match="remat"):
    ModelConfig.from_hf_config(VARIANTS["qwen2_tied"]().to_dict(), remat="some")


def test_unsupported_configs_are_rejected():
  with pytest.raises(ValueError, match="model_type 'gpt2'"):
    ModelConfig.from_hf_config({"model_type": "gpt2"})
  with pytest.raises(ValueError, match="use_sliding_window"):
    ModelConfig.from_hf_config({**VARIANTS["qwen2_tied"]().to_dict(), "use_sliding_window": True})
  with pytest.raises(FileNotFoundError, match="config.json"):
    ModelConfig.from_hf_config("/nonexistent-folder")
  with pytest.raises(FileNotFoundError, match="neither an embedded model"):
    load_pretrained("no-such-model")
