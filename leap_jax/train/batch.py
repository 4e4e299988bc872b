"""The learner's input: one token sequence per episode, with per-token weights."""
from __future__ import annotations

from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


def round_up(n: int, multiple: int) -> int:
  """The smallest multiple of `multiple` that is >= n."""
  return -(-n // multiple) * multiple


@flax.struct.dataclass
class TrainBatch:
  """One batch of episodes, each a single token sequence (all turns concatenated).

  Shapes (B episodes, L tokens):
    tokens: int32[B, L] prompt, policy and feedback tokens, right-padded.
    input_mask: bool[B, L] real (non-pad) tokens; the position of token t is t (right padding).
    policy_mask: bool[B, L] tokens the policy sampled; the only tokens that are trained.
    advantages: f32[B, L] advantage of each token (its turn's advantage on policy tokens).
    old_logprobs: f32[B, L] log pi_sampler(token_t | tokens_<t) recorded by the sampler.
    ref_logprobs: f32[B, L] or None, log-probs of a frozen reference, when precomputed.
    group_ids: int32[B] or None, the group of each row (rows of a group start with the same prompt; -1 for
      padding rows). With them the learner can run each group's shared prompt once (`learner.shared_prefix`).
  """
  tokens: jax.Array
  input_mask: jax.Array
  policy_mask: jax.Array
  advantages: jax.Array
  old_logprobs: jax.Array
  ref_logprobs: Optional[jax.Array] = None
  group_ids: Optional[jax.Array] = None

  @property
  def batch_size(self) -> int:
    return self.tokens.shape[0]

  def validate(self) -> "TrainBatch":
    """Checks shapes and dtypes; raises ValueError naming the first bad field."""
    if self.tokens.ndim != 2:
      raise ValueError(f"TrainBatch.tokens must be [B, L], got shape {self.tokens.shape}")
    if not jnp.issubdtype(self.tokens.dtype, jnp.integer):
      raise ValueError(f"TrainBatch.tokens must be integer, got {self.tokens.dtype}")
    for name in ("input_mask", "policy_mask", "advantages", "old_logprobs", "ref_logprobs"):
      value = getattr(self, name)
      if value is None:
        continue
      if value.shape != self.tokens.shape:
        raise ValueError(f"TrainBatch.{name} has shape {value.shape}, expected {self.tokens.shape} like tokens")
    for name in ("input_mask", "policy_mask"):
      if getattr(self, name).dtype != jnp.bool_:
        raise ValueError(f"TrainBatch.{name} must be bool, got {getattr(self, name).dtype}")
    if self.group_ids is not None and (self.group_ids.shape != self.tokens.shape[:1]
                                       or not jnp.issubdtype(self.group_ids.dtype, jnp.integer)):
      raise ValueError(f"TrainBatch.group_ids must be integer [B={self.tokens.shape[0]}], got "
                       f"{self.group_ids.dtype}{list(self.group_ids.shape)}")
    return self


def batch_from_numpy(
    tokens: np.ndarray,
    policy_mask: np.ndarray,
    advantages: np.ndarray,
    old_logprobs: np.ndarray,
    input_mask: Optional[np.ndarray] = None,
    ref_logprobs: Optional[np.ndarray] = None,
    group_ids: Optional[np.ndarray] = None,
) -> TrainBatch:
  """Builds a validated host-side TrainBatch with canonical dtypes (int32 / bool / float32)."""
  tokens = np.asarray(tokens, np.int32)
  if input_mask is None:
    input_mask = np.ones(tokens.shape, bool)
  return TrainBatch(
      tokens=tokens,
      input_mask=np.asarray(input_mask, bool),
      policy_mask=np.asarray(policy_mask, bool),
      advantages=np.asarray(advantages, np.float32),
      old_logprobs=np.asarray(old_logprobs, np.float32),
      ref_logprobs=None if ref_logprobs is None else np.asarray(ref_logprobs, np.float32),
      group_ids=None if group_ids is None else np.asarray(group_ids, np.int32),
  ).validate()
