"""The embedded SmolLM2-135M-Instruct GGUF: loading, tokenizer, parity with transformers, perplexity."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from leap_jax.models import embedded_gguf_path, load_pretrained
from leap_jax.models.gguf_io import unpermute_rows

PROMPT = [{"role": "user", "content": "Write a short poem about the sea."}]
PARAGRAPH = (
    "The city council met on Tuesday evening to discuss the new budget. Several residents spoke about the "
    "need for better roads and more funding for the public library. After a long debate, the council voted "
    "to approve the plan, which will take effect at the start of next year.")


@pytest.fixture(scope="session")
def smollm(embedded_model):
  return embedded_model


@pytest.fixture(scope="session")
def hf_gguf():
  path = embedded_gguf_path("smollm2-135m-instruct")
  kwargs = dict(gguf_file=os.path.basename(path))
  model = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), dtype=torch.float32, **kwargs)
  return model.eval(), transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), **kwargs)


def chat_ids(tokenizer):
  ids = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True)
  return list(ids["input_ids"] if not isinstance(ids, list) else ids)


def test_unpermute_inverts_llama_cpp_permutation():
  w = np.random.default_rng(0).standard_normal((3 * 8, 5))
  # llama.cpp: reshape(heads, 2, d/2, in).swapaxes(1, 2).
  permuted = w.reshape(3, 2, 4, 5).swapaxes(1, 2).reshape(w.shape)
  np.testing.assert_array_equal(unpermute_rows(permuted, 3), w)
  with pytest.raises(ValueError, match="even size"):
    unpermute_rows(w[:9], 3)


def test_config_and_tokenizer(smollm):
  model, tokenizer = smollm
  cfg = model.config
  assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) == (30, 576, 9, 3, 49152)
  assert cfg.tie_word_embeddings and not hasattr(model, "lm_head") and cfg.rope_theta == 100000.0
  assert tokenizer.eos_token == "<|im_end|>" and tokenizer.bos_token == "<|im_start|>"
  assert tokenizer.pad_token_id == 2
  text = tokenizer.decode(chat_ids(tokenizer))
  assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
  assert tokenizer.decode(tokenizer("x = 12345 + 7;")["input_ids"]) == "x = 12345 + 7;"
  # Digits are split one by one (llama.cpp "smollm" pre-tokenizer, as in the HF tokenizer.json).
  assert len(tokenizer("12345")["input_ids"]) == 5


def test_tokenizer_matches_transformers_gguf(smollm, hf_gguf):
  ours, theirs = smollm[1], hf_gguf[1]
  assert chat_ids(ours) == chat_ids(theirs)
  assert ours(PARAGRAPH)["input_ids"] == theirs(PARAGRAPH)["input_ids"]


def greedy(model, prompt, steps):
  """Greedy decoding without a cache: one fixed-length forward per token (causal, so padding is inert)."""
  graphdef, state = nnx.split(model)
  total = len(prompt) + steps
  positions = jnp.arange(total, dtype=jnp.int32)[None]

  @jax.jit
  def next_token(state, tokens, index):
    logits = nnx.merge(graphdef, state)(tokens, positions).logits
    return jnp.argmax(logits[0, index - 1]), logits[0]

  tokens = np.zeros((1, total), np.int32)
  tokens[0, :len(prompt)] = prompt
  for i in range(len(prompt), total):
    token, logits = next_token(state, jnp.asarray(tokens), i)
    tokens[0, i] = int(token)
  return tokens[0, len(prompt):].tolist(), np.asarray(logits[:-1])


def test_greedy_tokens_and_logits_match_transformers_gguf(smollm, hf_gguf):
  model, tokenizer = smollm
  prompt = chat_ids(tokenizer)
  ours, logits = greedy(model, prompt, 32)
  # transformers' greedy choice after every prefix of our sequence: its own greedy decode produces
  # exactly our tokens iff these argmaxes equal them.
  with torch.no_grad():
    want_logits = hf_gguf[0](torch.tensor([prompt + ours])).logits[0, :-1].numpy()
  assert ours == want_logits[len(prompt) - 1:].argmax(-1).tolist()
  np.testing.assert_allclose(logits, want_logits, atol=1e-3, rtol=0)
  text = tokenizer.decode(ours).lower()
  assert "sea" in text or "ocean" in text or "wave" in text, text


def test_perplexity_on_english_paragraph(smollm):
  model, tokenizer = smollm
  ids = jnp.asarray([tokenizer(PARAGRAPH)["input_ids"]], jnp.int32)
  positions = jnp.arange(ids.shape[1], dtype=jnp.int32)[None]
  logits = model(ids, positions).logits[0, :-1]
  nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), ids[0, 1:, None], -1).mean()
  perplexity = float(jnp.exp(nll))
  assert 1.0 < perplexity < 30.0, perplexity
