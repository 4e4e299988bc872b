"""Rollout -> learner: TrainBatch rows with per-token advantages, and rollout metrics."""
from __future__ import annotations

import numpy as np

from leap_jax.rollout.harness import NOT_GENERATED, STATUS_NAMES, RolloutBatch
from leap_jax.sampling.episode import stack_episodes
from leap_jax.train.batch import TrainBatch, batch_from_numpy


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def to_train_batch(batch: RolloutBatch, advantages: np.ndarray, *, pad_id: int = 0, row_multiple: int = 1,
                   length_multiple: int = 64) -> TrainBatch:
  """One row per token record (an episode, or an episode turn under the "latest" context policy).

  Each policy token carries the advantage of the turn that produced it, a[p, g, turn]; tokens of
  invalid trajectories, of prompts and of feedback are not trained (policy_mask False). Rows are
  padded to a multiple of `row_multiple` with empty rows and lengths to a multiple of
  `length_multiple`, so that steps of similar size share one compiled train step.

  Args:
    batch: the rollout, P tasks x G episodes x T turns.
    advantages: float32[P,G,T].
    pad_id: token id of padding.
    row_multiple: rows are padded to a multiple of this (minibatches x microbatches x data shards).
    length_multiple: lengths are padded to a multiple of this.

  Returns:
    TrainBatch of host arrays [B, L].
  """
  P, G, T = batch.generated.shape
  if advantages.shape != (P, G, T):
    raise ValueError(f"advantages have shape {advantages.shape}, expected [P,G,T]={(P, G, T)}")
  records, owners = [], []
  for e, segments in enumerate(batch.segments):
    for segment in segments:
      records.append(segment)
      owners.append(e)
  longest = max(1, max(len(r) for r in records))
  arrays = stack_episodes(records, length=_round_up(longest, length_multiple), pad_id=pad_id)
  owners = np.asarray(owners)
  p, g = np.divmod(owners, G)
  turns = np.clip(arrays["turns"], 0, T - 1)
  token_adv = advantages[p[:, None], g[:, None], turns]
  policy = arrays["policy_mask"] & batch.valid[p, g][:, None] & batch.keep[p[:, None], g[:, None], turns]
  rows = _round_up(len(records), row_multiple)
  extra = rows - len(records)

  def pad_rows(x, value):
    return np.concatenate([x, np.full((extra,) + x.shape[1:], value, x.dtype)]) if extra else x

  return batch_from_numpy(
      tokens=pad_rows(arrays["tokens"], pad_id),
      input_mask=pad_rows(arrays["input_mask"], False),
      policy_mask=pad_rows(policy, False),
      advantages=pad_rows(np.where(policy, token_adv, 0.0).astype(np.float32), 0.0),
      old_logprobs=pad_rows(arrays["sampler_logprobs"], 0.0))


def rollout_metrics(batch: RolloutBatch, advantages: np.ndarray, reward: np.ndarray) -> dict[str, float]:
  """Per-step rollout statistics.

  pass_rate@t: share of valid samples solved at some turn <= t (per sample, cumulative).
  active_groups: share of groups allowed past turn 1. turns_per_pass: generated turns / solved samples.
  status/<name>: share of generated or truncated turns with that status.
  """
  P, G, T = batch.generated.shape
  valid = batch.valid
  n_valid = max(int(valid.sum()), 1)
  solved_by = np.cumsum(batch.success & batch.keep, axis=-1) > 0
  out = {f"pass_rate@{t + 1}": float((solved_by[..., t] & valid).sum() / n_valid) for t in range(T)}
  solved = int((solved_by[..., -1] & valid).sum())
  kept = batch.keep
  out.update({
      "active_groups": float(batch.active.mean()),
      "valid_fraction": float(valid.mean()),
      "generated_rows": float(batch.counters["generated_rows"]),
      "generated_tokens": float(batch.counters["generated_tokens"]),
      "evaluator_calls": float(batch.counters["evaluator_calls"]),
      "eval_retries": float(batch.counters["eval_retries"]),
      "turns_per_sample": float(batch.generated.sum() / (P * G)),
      "turns_per_pass": float(batch.generated.sum() / solved) if solved else float("nan"),
      "truncated_turns": float(batch.truncated.sum()),
      "reward_mean": float(reward[valid].mean()) if valid.any() else 0.0,
      "reward_std": float(reward[valid].std()) if valid.any() else 0.0,
      "advantage_mean": float(advantages[kept].mean()) if kept.any() else 0.0,
      "advantage_abs_mean": float(np.abs(advantages[kept]).mean()) if kept.any() else 0.0,
      "advantage_nonzero": float((advantages[kept] != 0).mean()) if kept.any() else 0.0,
      "time_generate_s": batch.timings["generate"],
      "time_evaluate_s": batch.timings["evaluate"],
  })
  seen = batch.status[batch.status != NOT_GENERATED]
  for code, name in enumerate(STATUS_NAMES):
    out[f"status/{name}"] = float((seen == code).mean()) if seen.size else 0.0
  return out
