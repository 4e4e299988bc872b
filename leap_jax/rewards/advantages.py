"""Baseline reward and advantage estimators that LEAP is compared against.

GRPO (DeepSeekMath, arXiv 2402.03300) and Dr. GRPO (arXiv 2503.20783), RLOO (arXiv 2402.14740),
GRPO-MT (LEAP's multi-turn baseline, arXiv 2608.01804), Kevin's discounted multi-turn returns
(arXiv 2507.11948) and Dr.Kernel's turn-level leave-one-out advantage, TRLOO (arXiv 2602.05885).
Shapes: P problems, G samples per group, T turns (index t=0 is turn 1).
"""
import jax
import jax.numpy as jnp

from leap_jax.rewards import _checks


def grpo_advantages(rewards, valid=None, eps: float = 1e-6, scale_by_std: bool = True) -> jax.Array:
  """Group-normalised advantages over the valid samples of each group (GRPO, arXiv 2402.03300).

    μ_p = mean_{g valid} r[p,g],   σ_p = sqrt(Σ_{g valid} (r[p,g] − μ_p)² / (n_valid[p] − 1))
    A[p,g] = (r[p,g] − μ_p) / (σ_p + eps)   if scale_by_std (GRPO)
    A[p,g] =  r[p,g] − μ_p                  otherwise (Dr. GRPO, arXiv 2503.20783)

  σ is the unbiased sample deviation, as in common GRPO implementations. Invalid samples and
  groups with fewer than 2 valid samples get 0.

  Args:
    rewards: float[P,G], read only where valid.
    valid: optional bool[P,G]; default all True.
    eps: positive float added to σ.
    scale_by_std: Python bool, divide by σ.

  Returns:
    float[P,G], the dtype of `rewards`.
  """
  fn = "grpo_advantages"
  rewards = _checks.array(rewards, "rewards", fn, 2, float)
  valid = _checks.valid_mask(valid, rewards.shape, fn)
  if not isinstance(scale_by_std, bool):
    raise TypeError(f"{fn}: scale_by_std must be a Python bool, got {type(scale_by_std).__name__}")
  if isinstance(eps, (int, float)) and eps <= 0:
    raise ValueError(f"{fn}: eps={eps} must be positive")
  n_valid = jnp.sum(valid, axis=-1, keepdims=True, dtype=jnp.int32)
  r = jnp.where(valid, rewards, 0.0)
  mean = jnp.sum(r, axis=-1, keepdims=True) / jnp.maximum(n_valid, 1).astype(r.dtype)
  centred = jnp.where(valid, r - mean, 0.0)
  if scale_by_std:
    var = jnp.sum(centred**2, axis=-1, keepdims=True) / jnp.maximum(n_valid - 1, 1).astype(r.dtype)
    return centred / (jnp.sqrt(var) + eps)
  return centred


def rloo_advantages(rewards, valid=None) -> jax.Array:
  """Leave-one-out baseline over the valid samples of each group (RLOO, arXiv 2402.14740).

    A[p,g] = r[p,g] − Σ_{j valid, j≠g} r[p,j] / (n_valid[p] − 1)

  Invalid samples and groups with fewer than 2 valid samples get 0.

  Args:
    rewards: float[P,G], read only where valid.
    valid: optional bool[P,G]; default all True.

  Returns:
    float[P,G], the dtype of `rewards`.
  """
  fn = "rloo_advantages"
  rewards = _checks.array(rewards, "rewards", fn, 2, float)
  valid = _checks.valid_mask(valid, rewards.shape, fn)
  n_valid = jnp.sum(valid, axis=-1, keepdims=True, dtype=jnp.int32)
  r = jnp.where(valid, rewards, 0.0)
  others = (jnp.sum(r, axis=-1, keepdims=True) - r) / jnp.maximum(n_valid - 1, 1).astype(r.dtype)
  return jnp.where(valid & (n_valid >= 2), r - others, 0.0)


def kevin_returns(scores, keep, gamma=0.4) -> jax.Array:
  """Kevin's per-turn discounted return over the kept turns (arXiv 2507.11948).

    R[p,g,t] = Σ_{k>=t, keep[p,g,k]} gamma^(k−t) · S[p,g,k],   0 where not kept

  Kevin uses S = 0.3·correct + speedup and gamma = 0.4.

  Args:
    scores: float[P,G,T], read only where kept.
    keep: bool[P,G,T].
    gamma: discount in [0, 1] (Python or traced scalar).

  Returns:
    float[P,G,T], the dtype of `scores`.
  """
  fn = "kevin_returns"
  scores = _checks.array(scores, "scores", fn, 3, float)
  keep = _checks.array(keep, "keep", fn, 3, bool)
  _checks.same_shape([scores, keep], ["scores", "keep"], fn, 3)
  _checks.discount(gamma, fn)
  turns = jnp.arange(scores.shape[-1])
  lag = turns[None, :] - turns[:, None]  # [t, k] = k − t
  weights = jnp.where(lag >= 0, jnp.power(gamma, jnp.maximum(lag, 0).astype(scores.dtype)), 0.0)
  kept = jnp.where(keep, scores, 0.0)
  returns = jnp.sum(kept[..., None, :] * weights.astype(scores.dtype), axis=-1)
  return jnp.where(keep, returns, 0.0)


def trloo_advantages(returns, keep) -> jax.Array:
  """Turn-level leave-one-out advantage, TRLOO (Dr.Kernel, arXiv 2602.05885).

    A[p,g,t] = R[p,g,t] − Σ_{j≠g, keep[p,j,t]} R[p,j,t] / |{j≠g : keep[p,j,t]}|

  The baseline at turn index t averages only the other samples of the group that reached t;
  0 when no other sample did, and 0 where not kept.

  Args:
    returns: float[P,G,T], read only where kept (e.g. `kevin_returns(..., gamma=1.0)`).
    keep: bool[P,G,T].

  Returns:
    float[P,G,T], the dtype of `returns`.
  """
  fn = "trloo_advantages"
  returns = _checks.array(returns, "returns", fn, 3, float)
  keep = _checks.array(keep, "keep", fn, 3, bool)
  _checks.same_shape([returns, keep], ["returns", "keep"], fn, 3)
  kept = jnp.where(keep, returns, 0.0)
  n_others = jnp.sum(keep, axis=1, keepdims=True, dtype=jnp.int32) - keep.astype(jnp.int32)
  others = (jnp.sum(kept, axis=1, keepdims=True) - kept) / jnp.maximum(n_others, 1).astype(kept.dtype)
  return jnp.where(keep & (n_others > 0), kept - others, 0.0)


def any_turn_success_reward(success, keep) -> jax.Array:
  """GRPO-MT trajectory reward: solved at any kept turn (LEAP's baseline, arXiv 2608.01804).

    r[p,g] = 1[∃t : keep[p,g,t] ∧ s[p,g,t]]

  Args:
    success: bool[P,G,T], read only where kept.
    keep: bool[P,G,T].

  Returns:
    float32[P,G] in {0, 1}.
  """
  fn = "any_turn_success_reward"
  success = _checks.array(success, "success", fn, 3, bool)
  keep = _checks.array(keep, "keep", fn, 3, bool)
  _checks.same_shape([success, keep], ["success", "keep"], fn, 3)
  return jnp.any(success & keep, axis=-1).astype(jnp.float32)
