"""GPU figures of the sampler on a randomly initialised Qwen2.5-1.5B-shaped model in bf16 (no weights needed).

Measures prefill tokens/s, decode tokens/s at batch 1 and 64 (the sampler's own `lax.while_loop` decode, greedy,
after a warm-up call) and the decode's HBM bandwidth as a fraction of the device's peak:

  bandwidth = steps * (parameter bytes + KV-cache bytes read per step) / decode seconds

(every step reads all weights once and the full [N, B, K, S, d] key and value caches). Depends only on
jax, flax and numpy. On a machine without a GPU it reports `not_run: no GPU`.
"""
from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from leap_jax.models import ModelConfig, Transformer, init_cache
from leap_jax.sampling.sampler import SamplingParams, _decode, _last_logits

# HBM bandwidth in bytes/s by device kind (substring of `device_kind`).
PEAK_HBM_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}

QWEN25_1P5B = dict(
    model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
    num_heads=12, num_kv_heads=2, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6,
    max_position_embeddings=32768, qkv_bias=True, tie_word_embeddings=True, dtype="bfloat16",
    param_dtype="bfloat16", scan_layers=True)


def _timed(fn, *args, repeats: int = 3) -> float:
  """Best wall time of `fn(*args)` over `repeats` calls after one warm-up call, in seconds."""
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t)
  return best


def _peak_bandwidth(device) -> float | None:
  kind = getattr(device, "device_kind", "")
  return next((v for k, v in PEAK_HBM_BYTES_PER_S.items() if k in kind), None)


def run(out_dir: str | os.PathLike, prefill_batch: int = 16, prefill_len: int = 1024, prompt_len: int = 128,
        new_tokens: int = 256, decode_batches: tuple[int, ...] = (1, 64), model: dict | None = None,
        require_gpu: bool = True) -> dict:
  """Measures the figures above; writes them to `out_dir`/sampler_gpu.json and returns them.

  `model` replaces the Qwen2.5-1.5B shape (ModelConfig fields); `require_gpu=False` also measures on CPU.
  """
  if require_gpu and jax.default_backend() != "gpu":
    result = {"status": "not_run: no GPU", "backend": jax.default_backend()}
    print(f"sampler gpu section: {result['status']}")
    return result
  device = jax.devices()[0]
  cfg = ModelConfig(**(QWEN25_1P5B if model is None else model))
  graphdef, weights = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(weights))
  result = {"status": "ok", "device": device.device_kind, "jax": jax.__version__,
            "params": int(sum(x.size for x in jax.tree.leaves(weights))), "param_bytes": int(param_bytes)}

  def prefill(weights, tokens, cache_len):
    model = nnx.merge(graphdef, weights)
    B, L = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
    out = model(tokens, positions, init_cache(cfg, B, cache_len), return_logits=False)
    return out.cache, _last_logits(model, out.final_hidden, jnp.full((B,), L, jnp.int32))

  prefill_fn = jax.jit(prefill, static_argnums=2)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (prefill_batch, prefill_len)), jnp.int32)
  seconds = _timed(prefill_fn, weights, tokens, prefill_len)
  result["prefill"] = {"batch": prefill_batch, "length": prefill_len, "seconds": seconds,
                       "tokens_per_s": prefill_batch * prefill_len / seconds}

  greedy = SamplingParams(temperature=0.0)
  cache_len = prompt_len + new_tokens

  def decode(weights, cache, logits, last, keys):
    model = nnx.merge(graphdef, weights)
    B = logits.shape[0]
    first = jnp.full((B,), prompt_len, jnp.int32)
    _, out, _, count, _ = _decode(model, cache, logits, first, last, keys, jnp.zeros((B,), bool),
                                  params=greedy, max_new_tokens=new_tokens, stop_ids=(), cache_len=cache_len,
                                  pad_id=0, attend_len=cache_len)
    return out, count

  decode_fn = jax.jit(decode)
  peak = _peak_bandwidth(device)
  result["peak_hbm_bytes_per_s"] = peak
  kv_bytes_per_row = 2 * cfg.num_layers * cfg.num_kv_heads * cache_len * cfg.head_dim * jnp.dtype(cfg.dtype).itemsize
  for batch in decode_batches:
    prompts = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, prompt_len)), jnp.int32)
    cache, logits = prefill_fn(weights, prompts, cache_len)
    keys = jax.random.split(jax.random.key(0), batch)
    seconds = _timed(decode_fn, weights, cache, logits, prompts[:, -1], keys)
    _, count = decode_fn(weights, cache, logits, prompts[:, -1], keys)
    if not bool(jnp.all(count == new_tokens)):
      raise RuntimeError(f"decode produced {np.asarray(count).tolist()} tokens, expected {new_tokens} per row")
    # The first token comes from the prefill logits; each further token is one model step.
    bytes_read = (new_tokens - 1) * (param_bytes + batch * kv_bytes_per_row)
    entry = {"batch": batch, "new_tokens": new_tokens, "cache_len": cache_len, "seconds": seconds,
             "tokens_per_s": batch * new_tokens / seconds, "step_ms": 1e3 * seconds / (new_tokens - 1),
             "hbm_bytes_per_s": bytes_read / seconds}
    if peak:
      entry["hbm_fraction"] = bytes_read / seconds / peak
    result[f"decode_batch_{batch}"] = entry
    del cache
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "sampler_gpu.json"), "w") as f:
    json.dump(result, f, indent=2)
  print("sampler gpu section:", json.dumps(result, indent=2))
  return result


if __name__ == "__main__":
  import sys
  run(sys.argv[1] if len(sys.argv) > 1 else ".")
