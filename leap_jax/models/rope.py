"""Rotary position embeddings (RoPE), in the half-split layout LLaMA and Qwen2 checkpoints use on HF."""
import math

import jax
import jax.numpy as jnp
import numpy as np

from leap_jax.models.config import ModelConfig


def inverse_frequencies(cfg: ModelConfig) -> np.ndarray:
  """Per-pair rotation frequencies, f32[d/2].

  Default: inv_freq_i = theta^(-2i/d). "linear" divides them by `factor`. "llama3" divides the low
  frequencies (wavelength > original_max_position_embeddings / low_freq_factor) by `factor`, keeps the
  high ones and interpolates in between, as Meta's LLaMA 3.1 reference does.
  """
  d = cfg.head_dim
  inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
  scaling = cfg.rope_scaling_dict
  rope_type = scaling.get("rope_type", "default")
  if rope_type == "linear":
    inv_freq = inv_freq / scaling["factor"]
  elif rope_type == "llama3":
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    inv_freq = np.where(medium, smoothed, scaled)
  return inv_freq.astype(np.float32)


def rope_angles(cfg: ModelConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
  """sin and cos of position * inv_freq: int[B, L] -> (f32[B, L, d/2], f32[B, L, d/2])."""
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inverse_frequencies(cfg))
  return jnp.sin(angles), jnp.cos(angles)


def apply_rope(x: jax.Array, sin: jax.Array, cos: jax.Array) -> jax.Array:
  """Rotates channel pairs (i, i + d/2): [B, L, heads, d] with sin/cos [B, L, d/2] -> [B, L, heads, d].

  y_1 = x_1 cos - x_2 sin,  y_2 = x_2 cos + x_1 sin, computed in f32 and cast back to x.dtype.
  """
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  sin, cos = sin[:, :, None, :], cos[:, :, None, :]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)
