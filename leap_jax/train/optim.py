"""Optimiser: AdamW with global-norm clipping on a linear-warmup + cosine-decay schedule."""
from __future__ import annotations

import dataclasses

import jax
import optax


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """AdamW, clipping, schedule and accumulation; fields documented in `configs/common.py` (section `optim`)."""
  learning_rate: float = 1e-6
  warmup_steps: int = 0
  decay_steps: int = 0
  end_ratio: float = 0.1
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  weight_decay: float = 0.0
  max_grad_norm: float = 1.0
  grad_accum_steps: int = 1

  def __post_init__(self):
    if self.learning_rate <= 0:
      raise ValueError(f"optim.learning_rate must be > 0, got {self.learning_rate}")
    if self.warmup_steps < 0 or self.decay_steps < 0:
      raise ValueError(f"optim.warmup_steps / decay_steps must be >= 0, got {self.warmup_steps} / "
                       f"{self.decay_steps}")
    if 0 < self.decay_steps <= self.warmup_steps:
      raise ValueError(f"optim.decay_steps ({self.decay_steps}) must exceed optim.warmup_steps "
                       f"({self.warmup_steps})")
    if self.grad_accum_steps < 1:
      raise ValueError(f"optim.grad_accum_steps must be >= 1, got {self.grad_accum_steps}")


def learning_rate_schedule(cfg: OptimConfig) -> optax.Schedule:
  """lr(n) for optimiser update n.

    n < W:        lr * (n + 1) / W                                  (linear warmup, W = warmup_steps)
    W <= n < D:   lr_end + (lr - lr_end) * (1 + cos(pi (n - W) / (D - W))) / 2,  lr_end = lr * end_ratio
    n >= D:       lr_end                                            (D = decay_steps; 0 means constant lr)
  """
  peak = cfg.learning_rate
  warmup = optax.linear_schedule(peak / max(cfg.warmup_steps, 1), peak, max(cfg.warmup_steps - 1, 1))
  if cfg.decay_steps == 0:
    after = optax.constant_schedule(peak)
  else:
    after = optax.cosine_decay_schedule(peak, cfg.decay_steps - cfg.warmup_steps, alpha=cfg.end_ratio)
  if cfg.warmup_steps == 0:
    return after
  return optax.join_schedules([warmup, after], [cfg.warmup_steps])


def _decay_mask(params):
  """Weight decay on matrices only (ndim >= 2); biases and norm scales are not decayed."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
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
