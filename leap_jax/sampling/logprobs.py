"""Token log-probs shared by the sampler and the learner.

Definition (both sides): logp_t = log softmax(z_t / tau)[x_t], with z_t the logits predicting token x_t from
tokens x_<t and tau the sampling temperature (tau = 0, greedy, counts as tau = 1).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def effective_temperature(temperature: float) -> float:
  """The temperature log-probs are taken at: `temperature`, or 1 for greedy decoding (0)."""
  if temperature < 0:
    raise ValueError(f"temperature must be >= 0, got {temperature}")
  return 1.0 if temperature == 0 else float(temperature)


def token_logprobs(logits: jax.Array, tokens: jax.Array, temperature: float = 1.0) -> jax.Array:
  """log softmax(logits / tau)[token]: f32[..., V], int[...] -> f32[...]."""
  z = logits.astype(jnp.float32) / effective_temperature(temperature)
  picked = jnp.take_along_axis(z, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return picked - jax.nn.logsumexp(z, axis=-1)


def sequence_logprobs(graphdef: nnx.GraphDef, params: nnx.State, tokens: jax.Array, mask: jax.Array, *,
                      temperature: float = 1.0, chunk_size: int | None = 256) -> jax.Array:
  """Per-token log-probs of whole sequences for the learner; differentiable in `params`.

  The transformer runs once without its output layer; the output layer and log-softmax then run over chunks
  of `chunk_size` positions inside a `lax.scan` whose body is rematerialised, so neither the forward nor the
  backward pass holds more than one [B, chunk_size, V] block of logits.

  Args:
    graphdef, params: the model, as from `nnx.split(model)`.
    tokens: int32[B, L] right-padded sequences (position of token t is t).
    mask: bool[B, L] where to report log-probs (usually the policy tokens).
    temperature: tau of the definition above.
    chunk_size: positions per chunk; None computes all L positions at once.

  Returns:
    f32[B, L]: log p(tokens[:, t] | tokens[:, :t]) where mask is True and t > 0, else 0.
  """
  if tokens.ndim != 2 or mask.shape != tokens.shape:
    raise ValueError(f"tokens and mask must both be [B, L], got {tokens.shape} and {mask.shape}")
  if chunk_size is not None and chunk_size <= 0:
    raise ValueError(f"chunk_size must be positive or None, got {chunk_size}")
  B, L = tokens.shape
  model = nnx.merge(graphdef, params)
  positions = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
  hidden = model(tokens.astype(jnp.int32), positions, return_logits=False).final_hidden  # [B, L, D]
  # The state before token t is the hidden state at t - 1; position 0 has none (masked below).
  before = jnp.concatenate([jnp.zeros_like(hidden[:, :1]), hidden[:, :-1]], axis=1)

  def chunk_logprobs(h, x):
    return token_logprobs(model.logits_from_hidden(h), x, temperature)

  C = L if chunk_size is None else min(chunk_size, L)
  n = -(-L // C)
  pad = n * C - L
  h = jnp.pad(before, ((0, 0), (0, pad), (0, 0))).reshape(B, n, C, -1).swapaxes(0, 1)  # [n, B, C, D]
  x = jnp.pad(tokens, ((0, 0), (0, pad))).reshape(B, n, C).swapaxes(0, 1)  # [n, B, C]
  body = jax.checkpoint(chunk_logprobs)
  _, out = jax.lax.scan(lambda carry, hx: (carry, body(*hx)), None, (h, x))
  out = out.swapaxes(0, 1).reshape(B, n * C)[:, :L]
  keep = mask.astype(bool) & (jnp.arange(L) > 0)[None, :]
  return jnp.where(keep, out, 0.0)
