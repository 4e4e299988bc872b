"""Per-token policy-gradient terms and their aggregation.

All functions are pure and jittable. Notation (per token t of episode i):
  r_t = pi_theta(a_t | s_t) / pi_old(a_t | s_t) = exp(logp_t - old_t)          (PPO, arXiv 1707.06347)
  L_t = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)                (PPO; asymmetric "clip-higher",
                                                                                  DAPO arXiv 2503.14476)
  w_t = min(pi_old_learner / pi_sampler, C)                                    (truncated importance sampling
                                                                                  for the sampler/learner mismatch)
  KL_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1                            (k3 estimator of KL(pi_theta||pi_ref),
                                                                                  GRPO arXiv 2402.03300 eq. 4)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

AGGREGATIONS = ("token_mean", "sequence_mean", "constant")


def clipped_surrogate(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    eps_low: float,
    eps_high: float,
) -> tuple[jax.Array, jax.Array]:
  """PPO clipped surrogate loss per token.

  Args:
    logprobs: f32[B, L] log pi_theta of the taken tokens (differentiable).
    old_logprobs: f32[B, L] log pi_old of the same tokens.
    advantages: f32[B, L] per-token advantages A_t.
    eps_low: lower clip, r_t >= 1 - eps_low.
    eps_high: upper clip, r_t <= 1 + eps_high (eps_high > eps_low is DAPO's clip-higher).

  Returns:
    (loss f32[B, L] = -min(r A, clip(r) A), clipped bool[B, L]) where `clipped` marks tokens whose
    gradient the clip removed: r < 1 - eps_low with A < 0, or r > 1 + eps_high with A > 0.
  """
  ratio = jnp.exp(logprobs - old_logprobs)
  clipped_ratio = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  loss = -jnp.minimum(ratio * advantages, clipped_ratio * advantages)
  clipped = ((ratio < 1.0 - eps_low) & (advantages < 0)) | ((ratio > 1.0 + eps_high) & (advantages > 0))
  return loss, clipped


def k3_kl(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
  """k3 estimate of KL(pi_theta || pi_ref) per token: exp(ref - logp) - (ref - logp) - 1 >= 0.

  Shapes: f32[B, L] -> f32[B, L]. Samples are assumed drawn from pi_theta (GRPO eq. 4).
  """
  log_ratio = ref_logprobs - logprobs
  return jnp.exp(log_ratio) - log_ratio - 1.0


def approx_kl(logprobs: jax.Array, old_logprobs: jax.Array) -> jax.Array:
  """k3 estimate of KL(pi_old || pi_theta) per token with samples from pi_old: (r - 1) - log r.

  Shapes: f32[B, L] -> f32[B, L], r = exp(logprobs - old_logprobs).
  """
  log_ratio = logprobs - old_logprobs
  return jnp.expm1(log_ratio) - log_ratio


def truncated_is_weight(learner_logprobs: jax.Array, sampler_logprobs: jax.Array, cap: float) -> jax.Array:
  """Truncated importance weight w_t = min(exp(learner_t - sampler_t), cap) for the sampler mismatch.

  Shapes: f32[B, L] -> f32[B, L]. Constant with respect to the parameters (stop-gradient).
  """
  if cap <= 0:
    raise ValueError(f"truncated importance-sampling cap must be > 0, got {cap}")
  weight = jnp.minimum(jnp.exp(learner_logprobs - sampler_logprobs), cap)
  return jax.lax.stop_gradient(weight)


def aggregation_denominators(policy_mask: jax.Array, mode: str, norm_length: int | None = None,
                             episodes: jax.Array | None = None) -> jax.Array:
  """Per-token divisor d[B, L] so that the aggregated loss is sum_{i,t} mask_it * loss_it / d_it.

  Computed once over a whole minibatch, so that splitting it into microbatches and summing
  their gradients gives exactly the minibatch gradient.

    token_mean:    d = sum_{i,t} mask_it                 (every policy token weighs the same)
    sequence_mean: d = B' * sum_t mask_it                (GRPO: mean over tokens, then episodes)
    constant:      d = B' * norm_length                  (Dr. GRPO arXiv 2503.20783: no length bias)

  with i the episodes and B' those that have a policy token: padding rows (added for the mesh or the
  microbatches, or the empty slots of the shared-prefix layout) do not dilute the loss.

  Args:
    policy_mask: bool[B, L].
    mode: one of AGGREGATIONS.
    norm_length: constant per-episode token budget for mode "constant"; defaults to L.
    episodes: int32[B, L] the episode of each token (ids below B * L, any order) when a row holds several
      (packed shared-prefix slots); None: each row is one episode.

  Returns:
    f32[B, L] positive divisors.
  """
  mask = policy_mask.astype(jnp.float32)
  length = mask.shape[1]
  if episodes is None:
    per_episode = jnp.broadcast_to(mask.sum(axis=1, keepdims=True), mask.shape)
    batch = jnp.sum(mask.max(axis=1))
  else:
    ids = jnp.clip(episodes, 0, mask.size - 1).reshape(-1)  # padding (mask 0) may point anywhere
    counts = jax.ops.segment_sum(mask.reshape(-1), ids, num_segments=mask.size)
    per_episode = counts[ids].reshape(mask.shape)
    batch = jnp.sum(counts > 0)
  batch = jnp.maximum(batch, 1.0)
  if mode == "token_mean":
    d = jnp.maximum(mask.sum(), 1.0) * jnp.ones_like(mask)
  elif mode == "sequence_mean":
    d = batch * jnp.maximum(per_episode, 1.0)
  elif mode == "constant":
    norm = length if norm_length is None else norm_length
    if norm <= 0:
      raise ValueError(f"norm_length must be > 0 for aggregation 'constant', got {norm}")
    d = batch * float(norm) * jnp.ones_like(mask)
  else:
    raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {AGGREGATIONS}")
  return d
