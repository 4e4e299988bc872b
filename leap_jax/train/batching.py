"""Rollout -> learner: TrainBatch rows with per-token advantages, and rollout metrics."""
from __future__ import annotations

import numpy as np

from leap_jax.metrics import rollout_stats
from leap_jax.rollout.harness import STATUS_NAMES, RolloutBatch
from leap_jax.sampling.episode import stack_episodes
from leap_jax.sampling.buckets import bucket
from leap_jax.train.batch import TrainBatch, batch_from_numpy, round_up


def to_train_batch(batch: RolloutBatch, advantages: np.ndarray, *, pad_id: int = 0, row_multiple: int = 1,
                   length_multiple: int = 16, drop_zero_advantage: bool = False) -> TrainBatch:
  """One row per token record (an episode, or an episode turn under the "latest" context policy).

  Each policy token carries the advantage of the turn that produced it, a[p, g, turn]; tokens of
  invalid trajectories, of prompts and of feedback are not trained (policy_mask False). A row's group id
  is its task p (the rows of a task start with the same prompt). Rows are padded to a multiple of
  `row_multiple` with empty rows (group -1) and lengths to `bucket(longest, length_multiple)`, so that steps
  of similar size share one compiled train step.

  Args:
    batch: the rollout, P tasks x G episodes x T turns.
    advantages: float32[P,G,T].
    pad_id: token id of padding.
    row_multiple: rows are padded to a multiple of this (minibatches x microbatches x data shards).
    length_multiple: the floor of the length ladder (`buckets.bucket`).
    drop_zero_advantage: leave out records whose trained tokens all have advantage 0 (e.g. every
      sample of an all-pass or all-fail group under a zero-sum reward). Without a KL term they add no
      gradient, only tokens to the normaliser and compute (DAPO's dynamic sampling filters the same
      groups). A step where every record drops trains on empty rows.

  Returns:
    TrainBatch of host arrays [B, L].
  """
  P, G, T = batch.generated.shape
  if advantages.shape != (P, G, T):
    raise ValueError(f"advantages have shape {advantages.shape}, expected [P,G,T]={(P, G, T)}")
  records, owners, first_turns = [], [], []
  for e, (segments, firsts) in enumerate(zip(batch.segments, batch.first_turns)):
    records += segments
    owners += [e] * len(segments)
    first_turns += firsts
  if drop_zero_advantage:
    p_all, g_all = np.divmod(np.asarray(owners), G)
    trained = batch.valid[p_all, g_all][:, None] & batch.keep[p_all, g_all] & (advantages[p_all, g_all] != 0)
    kept_records = [i for i in range(len(records)) if trained[i].any()]
    records, owners = [records[i] for i in kept_records], [owners[i] for i in kept_records]
    first_turns = [first_turns[i] for i in kept_records]
  if not records:
    return _empty_batch(max(row_multiple, 1), length_multiple, pad_id)
  longest = max(1, max(len(r) for r in records))
  arrays = stack_episodes(records, length=bucket(longest, length_multiple), pad_id=pad_id)
  owners = np.asarray(owners)
  p, g = np.divmod(owners, G)
  turns = np.clip(arrays["turns"] + np.asarray(first_turns)[:, None], 0, T - 1)  # padding is not trained
  token_adv = advantages[p[:, None], g[:, None], turns]
  policy = arrays["policy_mask"] & batch.valid[p, g][:, None] & batch.keep[p[:, None], g[:, None], turns]
  rows = round_up(len(records), row_multiple)
  extra = rows - len(records)

  def pad_rows(x, value):
    return np.concatenate([x, np.full((extra,) + x.shape[1:], value, x.dtype)]) if extra else x

  return batch_from_numpy(
      tokens=pad_rows(arrays["tokens"], pad_id),
      input_mask=pad_rows(arrays["input_mask"], False),
      policy_mask=pad_rows(policy, False),
      advantages=pad_rows(np.where(policy, token_adv, 0.0).astype(np.float32), 0.0),
      old_logprobs=pad_rows(arrays["sampler_logprobs"], 0.0),
      group_ids=pad_rows(p.astype(np.int32), -1))


def _empty_batch(rows: int, length: int, pad_id: int) -> TrainBatch:
  zeros = np.zeros((rows, length), np.float32)
  mask = np.zeros((rows, length), bool)
  return batch_from_numpy(tokens=np.full((rows, length), pad_id, np.int32), input_mask=mask, policy_mask=mask,
                          advantages=zeros, old_logprobs=zeros)


def rollout_metrics(batch: RolloutBatch, advantages: np.ndarray, reward: np.ndarray) -> dict[str, float]:
  """Per-step rollout statistics: `leap_jax.metrics.rollout_stats.rollout_metrics` (pass rate by turn,
  groups, turns, status shares, reward and advantage stats) plus the cost of the step.

  cost/generated_rows, cost/generated_tokens: sampled turns and tokens; cost/evaluator_calls, cost/eval_retries;
  turns/truncated; valid_fraction; time/generate, time/evaluate (seconds).
  """
  status = np.where(batch.keep, batch.status, 0)
  out = rollout_stats.rollout_metrics(batch.success, batch.keep, batch.active, reward, advantages, status,
                                      batch.valid, status_names=STATUS_NAMES)
  out.update({
      "valid_fraction": float(batch.valid.mean()),
      "cost/generated_rows": float(batch.counters["generated_rows"]),
      "cost/generated_tokens": float(batch.counters["generated_tokens"]),
      "cost/evaluator_calls": float(batch.counters["evaluator_calls"]),
      "cost/eval_retries": float(batch.counters["eval_retries"]),
      "turns/truncated": float(batch.truncated.sum()),
      "time/generate": batch.timings["generate"],
      "time/evaluate": batch.timings["evaluate"],
  })
  return out
