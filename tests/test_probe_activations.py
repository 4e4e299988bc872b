"""Probe features from a tiny random model's real activations: caching, pooling, and a planted textual signal."""
import dataclasses
import json

import numpy as np
import pytest
from flax import nnx
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import kernels_eval
from leap_jax.models import ModelConfig, Transformer
from probe import activations
from probe import linear
from probe import metrics

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start|>{{ m['role'] }} {{ m['content'] }}<|end|>"
            "{% endfor %}{% if add_generation_prompt %}<|start|>assistant {% endif %}")
MARKER = "Note: zebra zebra zebra zebra zebra zebra. "
PLAIN = "Note: every value is a plain float. "


def word_tokenizer(texts):
  """A word-level tokenizer over the words of `texts` (with a chat template)."""
  split = pre_tokenizers.Whitespace()
  words = sorted({w for t in texts for w, _ in split.pre_tokenize_str(t)})
  vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "<|start|>", "<|end|>"] + words)}
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = split
  return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                 additional_special_tokens=["<|start|>", "<|end|>"], chat_template=TEMPLATE)


def tiny_model(vocab_size, layers=2, width=64, seed=0, dtype="float32"):
  cfg = ModelConfig(model_type="llama", vocab_size=vocab_size, hidden_size=width, intermediate_size=2 * width,
                    num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=width // 4, tie_word_embeddings=True,
                    max_position_embeddings=4096, dtype=dtype)
  return Transformer(cfg, rngs=nnx.Rngs(seed))


@pytest.fixture(scope="module")
def labelled_texts():
  tasks = [t for t in kernels_eval.load_tasks() if t.level >= 1]
  texts, labels = [], []
  for t in tasks:
    for label, suffix in ((1, MARKER), (0, PLAIN)):
      texts.append(kernels_eval.render_task(dataclasses.replace(t, statement=suffix + t.statement), "pallas"))
      labels.append(label)
  return texts, np.array(labels)


def _stratified_split(y, heldout_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(train, held-out) indices with both classes in both parts."""
  rng, train, held = np.random.default_rng(seed), [], []
  for c in (0, 1):
    idx = rng.permutation(np.flatnonzero(y == c))
    k = min(len(idx) - 1, max(1, int(round(len(idx) * heldout_fraction))))
    held.extend(idx[:k])
    train.extend(idx[k:])
  return np.sort(np.array(train, int)), np.sort(np.array(held, int))


def test_textual_feature_decides_label(labelled_texts, tmp_path):
  texts, y = labelled_texts
  tok = word_tokenizer(texts)
  extractor = activations.ActivationExtractor(tiny_model(len(tok)), tok, model_id="tiny/random:0", layer=1,
                                              cache_dir=tmp_path, batch_size=32, max_tokens=64)
  feats = extractor(texts)
  assert feats.shape == (len(texts), 64) and np.all(np.isfinite(feats))
  train, held = _stratified_split(y, 0.4, seed=0)
  params = linear.fit_linear_probe(feats[train], y[train], l2=1e-3, steps=400)
  logits = np.asarray(linear.probe_predict(params, feats[held]))
  assert metrics.auroc(y[held], logits) > 0.9
  shuffled = np.random.default_rng(1).permutation(y)
  params = linear.fit_linear_probe(feats[train], shuffled[train], l2=1e-1, steps=400)
  assert metrics.auroc(shuffled[held], np.asarray(linear.probe_predict(params, feats[held]))) < 0.8


def test_pooling_is_masked_mean_and_cached(tmp_path):
  texts = ["a b c", "a b c d e f g h i j k l m n o p q r s"]
  tok = word_tokenizer(texts)
  model = tiny_model(len(tok), layers=3)
  extractor = activations.ActivationExtractor(model, tok, model_id="m", cache_dir=tmp_path, batch_size=2)
  assert extractor.layer == activations.default_layer(3) == 1
  feats = extractor(texts)
  alone = activations.ActivationExtractor(model, tok, model_id="m2", batch_size=1)([texts[0]])
  np.testing.assert_allclose(feats[0], alone[0], rtol=1e-5, atol=1e-6)  # padding does not leak into the pool
  ids = tok.encode(texts[0], add_special_tokens=False)
  positions = np.arange(len(ids))[None]
  hidden = model(np.array([ids]), positions, hidden_layers=(1,), return_logits=False).hidden[0, 0]
  np.testing.assert_allclose(feats[0], np.asarray(hidden).mean(0), rtol=1e-5, atol=1e-6)
  assert len(list(extractor.cache.glob("*.npy"))) == 2 and extractor.cache.parent == tmp_path / "m"
  extractor.params = None  # a cache hit never runs the model
  np.testing.assert_array_equal(extractor(texts), feats)
  with pytest.raises(ValueError, match="layer"):
    activations.ActivationExtractor(model, tok, model_id="m", layer=9)


def test_cache_misses_when_the_model_or_a_setting_changes(tmp_path):
  texts = ["a b c", "c b a d"]
  tok = word_tokenizer(texts)
  model = tiny_model(len(tok), layers=3)

  def make(m, **kw):
    kw = {"model_id": "same-name", "layer": 1, "cache_dir": tmp_path, "max_tokens": 8, **kw}
    return activations.ActivationExtractor(m, tok, **kw)

  first = make(model)(texts)
  retrained = tiny_model(len(tok), layers=3, seed=1)  # other weights under the same name (a retrained folder)
  np.testing.assert_allclose(make(retrained)(texts), make(retrained, cache_dir=None)(texts), rtol=1e-6)
  assert not np.allclose(make(retrained)(texts), first)
  np.testing.assert_array_equal(make(model)(texts), first)  # same model and settings: a hit
  bf16 = tiny_model(len(tok), layers=3, dtype="bfloat16")  # same float32 weights, bf16 compute
  for other in (make(retrained), make(model, layer=2), make(model, max_tokens=2), make(bf16)):
    assert other.cache != make(model).cache and other.cache.parent == tmp_path / "same-name"
  assert json.loads((make(model).cache / "key.json").read_text())["pooling"] == "mean"
  assert len({make(m).cache for m in (model, tiny_model(len(tok), layers=3))}) == 1  # same seed, same weights
