"""Optimiser: AdamW with global-norm clipping on a linear-warmup + cosine-decay schedule."""
from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import optax

if TYPE_CHECKING:  # annotations only: the optimiser builds without ml_collections installed
  import ml_collections


def learning_rate_schedule(cfg: ml_collections.ConfigDict) -> optax.Schedule:
  """lr(n) for optimiser update n.

    n < W:        lr * (n + 1) / W                                  (linear warmup, W = warmup_steps)
    W <= n < D:   lr_end + (lr - lr_end) * (1 + cos(pi (n - W) / (D - W))) / 2,  lr_end = lr * end_ratio
    n >= D:       lr_end                                            (D = decay_steps; 0 means constant lr)
  """
  if cfg.learning_rate <= 0:
    raise ValueError(f"optim.learning_rate must be > 0, got {cfg.learning_rate}")
  if cfg.warmup_steps < 0 or cfg.decay_steps < 0:
    raise ValueError(f"optim.warmup_steps / decay_steps must be >= 0, got {cfg.warmup_steps} / {cfg.decay_steps}")
  peak = cfg.learning_rate
  warmup = optax.linear_schedule(peak / max(cfg.warmup_steps, 1), peak, max(cfg.warmup_steps - 1, 1))
  if cfg.decay_steps == 0:
    after = optax.constant_schedule(peak)
  else:
    if cfg.decay_steps <= cfg.warmup_steps:
      raise ValueError(f"optim.decay_steps ({cfg.decay_steps}) must exceed warmup_steps ({cfg.warmup_steps})")
    after = optax.cosine_decay_schedule(peak, cfg.decay_steps - cfg.warmup_steps, alpha=cfg.end_ratio)
  if cfg.warmup_steps == 0:
    return after
  return optax.join_schedules([warmup, after], [cfg.warmup_steps])


def _decay_mask(params):
  """Weight decay on matrices only (ndim >= 2); biases and norm scales are not decayed."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """clip_by_global_norm(max_grad_norm) then AdamW(lr schedule, b1, b2, eps, weight_decay).

  Gradient accumulation (`cfg.grad_accum_steps`) is done by the learner over microbatches
  before this transformation sees the summed gradient, so one call = one optimiser update.
  """
  chain = []
  if cfg.max_grad_norm > 0:
    chain.append(optax.clip_by_global_norm(cfg.max_grad_norm))
  chain.append(optax.adamw(
      learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay,
      mask=_decay_mask))
  return optax.chain(*chain)
