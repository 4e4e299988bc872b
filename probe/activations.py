"""Probe features: pooled hidden states of a frozen reference model over rendered task text.

Shapes: N texts, B texts per forward call, L bucketed token length, D hidden size.

One forward pass per text (right-padded, causal, so padding never changes real tokens); the residual stream
h_l of layer `layer` (HF hidden_states indexing: 0 = embeddings, n = output of block n) is mean-pooled over
the text's tokens:

  f = sum_t m_t h_l[t] / sum_t m_t,   m_t = 1 for real tokens.

Features are cached on disk as `<cache_dir>/<model_id>/<key>/<sha256(text)>.npy`, where key hashes everything
else a feature depends on (`cache_key`, also written to `key.json` there): the weights' fingerprint
(`weights_fingerprint`), the compute dtype, the layer, the pooling and the token cut, so that another model under
the same name (a retrained checkpoint in the same folder) or another setting misses instead of reading stale
features.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import re
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from leap_jax.sampling.buckets import bucket_length


POOLING = "mean"  # the masked mean of the module docstring, the only pooling; part of the cache key
_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


@jax.jit
def _leaf_digest(x: jax.Array) -> jax.Array:
  """uint32[2]: sum_i b_i m_i mod 2^32 for two odd multiplier sequences m_i, b_i = the bits of element i.

  Multiplying by an odd number is a bijection mod 2^32, so changing any one element changes both sums; other
  changes leave both unchanged with probability about 2^-64. Runs where the weights live (no host copy).
  """
  bits = jax.lax.bitcast_convert_type(x, _UINT[x.dtype.itemsize]).astype(jnp.uint32).ravel()
  i = jnp.arange(bits.size, dtype=jnp.uint32)
  first = jnp.sum(bits * (2 * i + 1), dtype=jnp.uint32)
  second = jnp.sum(bits * ((i * jnp.uint32(0x9E3779B1)) | 1), dtype=jnp.uint32)
  return jnp.stack([first, second])


def weights_fingerprint(params) -> str:
  """Hex fingerprint of a parameter pytree: every leaf's path, shape, dtype and `_leaf_digest`."""
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    h.update(f"{jax.tree_util.keystr(path)}|{leaf.shape}|{leaf.dtype}|".encode())
    h.update(np.asarray(_leaf_digest(leaf)).tobytes())
  return h.hexdigest()[:32]


def cache_key(*, weights: str, dtype: str, layer: int, max_tokens: int) -> dict[str, Any]:
  """What a cached feature depends on besides the text and the model's name (`cache_folder` hashes it)."""
  return {"weights": weights, "dtype": dtype, "layer": int(layer), "pooling": POOLING, "max_tokens": int(max_tokens)}


def cache_folder(cache_dir: str | os.PathLike, model_id: str, key: dict[str, Any]) -> pathlib.Path:
  """<cache_dir>/<model_id, path-safe>/<first 16 hex digits of sha256(key as sorted JSON)>."""
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
  return pathlib.Path(cache_dir) / re.sub(r"[^A-Za-z0-9_.-]+", "_", model_id) / digest


def default_layer(num_layers: int) -> int:
  """About a third of the depth (at least 1)."""
  return max(1, round(num_layers / 3))


@functools.partial(jax.jit, static_argnames=("graphdef", "layer"))
def _pooled(graphdef, params, tokens, mask, *, layer: int):
  model = nnx.merge(graphdef, params)
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
  out = model(tokens, positions, hidden_layers=(layer,), return_logits=False)
  h = out.hidden[0].astype(jnp.float32)
  m = mask.astype(jnp.float32)[..., None]
  return jnp.sum(h * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)


class ActivationExtractor:
  """Mean-pooled layer features of texts under a frozen model, with a disk cache.

  Args:
    model: a `leap_jax.models.Transformer` (not modified).
    tokenizer: has `encode(text, add_special_tokens=False)`.
    model_id: names the model's cache folder (e.g. "smollm2-135m-instruct"); the cache key is its weights.
    layer: residual stream index in [1, num_layers]; None = `default_layer`.
    cache_dir: feature cache folder; None disables caching.
    max_tokens: texts are cut to this many tokens.
    batch_size: texts per forward call.
  """

  def __init__(self, model, tokenizer, *, model_id: str, layer: int | None = None,
               cache_dir: str | os.PathLike | None = None, max_tokens: int = 2048, batch_size: int = 8):
    n = model.config.num_layers
    self.layer = default_layer(n) if layer is None else int(layer)
    if not 0 <= self.layer <= n:
      raise ValueError(f"layer={self.layer} must be in [0, {n}] for a {n}-layer model")
    self.graphdef, self.params = nnx.split(model)
    self.tokenizer = tokenizer
    self.model_id = model_id
    self.max_tokens = int(max_tokens)
    self.batch_size = int(batch_size)
    self.width = model.config.hidden_size
    self.cache = None
    if cache_dir is not None:
      key = cache_key(weights=weights_fingerprint(self.params), dtype=model.config.dtype, layer=self.layer,
                      max_tokens=self.max_tokens)
      self.cache = cache_folder(cache_dir, model_id, key)
      self.cache.mkdir(parents=True, exist_ok=True)
      (self.cache / "key.json").write_text(json.dumps(key, sort_keys=True) + "\n")

  def _path(self, text: str) -> pathlib.Path:
    return self.cache / f"{hashlib.sha256(text.encode('utf-8')).hexdigest()}.npy"

  def _encode(self, text: str) -> list[int]:
    ids = list(self.tokenizer.encode(text, add_special_tokens=False))[: self.max_tokens]
    if not ids:
      raise ValueError("cannot pool the activations of an empty text")
    return ids

  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    """f32[N, D] pooled features of `texts`."""
    out = np.zeros((len(texts), self.width), np.float32)
    missing = []
    for i, text in enumerate(texts):
      if self.cache is not None and self._path(text).is_file():
        out[i] = np.load(self._path(text))
      else:
        missing.append(i)
    for start in range(0, len(missing), self.batch_size):
      rows = missing[start:start + self.batch_size]
      ids = [self._encode(texts[i]) for i in rows]
      length = bucket_length(max(len(x) for x in ids))
      tokens = np.zeros((self.batch_size, length), np.int32)
      mask = np.zeros((self.batch_size, length), bool)
      for r, x in enumerate(ids):
        tokens[r, :len(x)] = x
        mask[r, :len(x)] = True
      feats = np.asarray(_pooled(self.graphdef, self.params, tokens, mask, layer=self.layer))
      for r, i in enumerate(rows):
        out[i] = feats[r]
        if self.cache is not None:
          self._save(self._path(texts[i]), feats[r])
    return out

  @staticmethod
  def _save(path: pathlib.Path, value: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
    np.save(tmp, value)
    os.replace(tmp, path)


def task_text(task: Any, lang: str = "pallas") -> str:
  """The text the probe reads: the task as the solver sees it (`kernels_eval.render_task`)."""
  import kernels_eval  # pylint: disable=import-outside-toplevel
  return kernels_eval.render_task(task, lang)
