"""GRPO for the task generator: sample G tasks per prompt, score them with the probe reward, build the
learner's batch; and the real-solver audit.

One step, P prompts x G samples (row r = p * G + g):
  reward r[p, g] = probe reward of the checked generation (`reward.ProbeReward`, r_bad when invalid),
  A[p, g] = (r - mean_g r) / (std_g r + eps)            (`leap_jax.rewards.grpo_advantages`),
and every completion token of row r carries A[p, g]; the KL to the frozen reference is the learner's k3 term.

Audit (every N steps): M tasks from the current generator, each valid one solved K times by the corpus
solver; reports, over all M generations,
  frontier_utility = #(valid and a <= passes <= b) / M,   validity = #valid / M,
and over the valid ones the all-solved share, the share of the most common op family (collapse detector) and
the diversity of their task files, Self-BLEU and distinct-3 (`diversity`).
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Sequence

import numpy as np

from leap_jax.rewards import grpo_advantages
from leap_jax.sampling.buckets import bucket_length
from leap_jax.train import batch as batch_lib
from probe import corpus as corpus_lib
from probe import diversity
from probe import generator as generator_lib


@dataclasses.dataclass
class GeneratorRollout:
  """One step's samples: the learner batch, rewards [P, G] and the checked generations [P * G]."""
  batch: batch_lib.TrainBatch
  rewards: np.ndarray
  checked: list[generator_lib.GeneratedTask]

  def metrics(self) -> dict[str, float]:
    valid = np.array([c.valid for c in self.checked])
    families = [c.family for c in self.checked if c.valid]
    return {"reward/mean": float(self.rewards.mean()), "reward/std": float(self.rewards.std()),
            "validity": float(valid.mean()), "top_family_share": _top_share(families)}


def _top_share(families: Sequence[str]) -> float:
  if not families:
    return 0.0
  return collections.Counter(families).most_common(1)[0][1] / len(families)


def step_seeds(run_seed: int, step: int, num_prompts: int) -> list[int]:
  """Prompt seeds of one step: task_seed(run_seed, step * P + p)."""
  return [corpus_lib.task_seed(run_seed, step * num_prompts + p) for p in range(num_prompts)]


def sample_generations(source, params, checker: generator_lib.TaskChecker, reward_fn, seeds: Sequence[int],
                       group_size: int, key, *, pad_id: int, to_text: Callable[[str], str] =
                       generator_lib.extract_task_source) -> GeneratorRollout:
  """Samples G replies per prompt seed under `params`, checks and scores them, and builds the TrainBatch.

  Args:
    source: `sources.ModelTaskSource` (prompts, sampler, chat).
    params: current generator weights.
    checker: TaskChecker (use remember=False during RL).
    reward_fn: checked generations -> f32[n] rewards (`ProbeReward`).
    seeds: P prompt seeds.
    group_size: G.
    key: sampler key (row r uses fold_in(key, r)).
    pad_id: token id used for padding.
    to_text: reply -> task file text.
  """
  prompts = source.prompts(seeds)
  _, completions = source.sampler.start(params, prompts, group_size, key, max_new_tokens=source.max_new_tokens,
                                        sampling=source.sampling)
  replies = [source.chat.decode(c.tokens, skip_special_tokens=True) for c in completions]
  checked = [checker.check(to_text(r)) for r in replies]
  P, G = len(seeds), group_size
  rewards = np.asarray(reward_fn(checked), np.float32).reshape(P, G)
  adv = np.asarray(grpo_advantages(rewards)).reshape(-1)
  rows = [(prompts[r // G], c) for r, c in enumerate(completions)]
  length = bucket_length(max(len(p) + len(c.tokens) for p, c in rows))
  tokens = np.full((P * G, length), pad_id, np.int32)
  input_mask = np.zeros((P * G, length), bool)
  policy_mask = np.zeros((P * G, length), bool)
  advantages = np.zeros((P * G, length), np.float32)
  old_logprobs = np.zeros((P * G, length), np.float32)
  for r, (p, c) in enumerate(rows):
    n, m = len(p), len(c.tokens)
    tokens[r, :n], tokens[r, n:n + m] = p, c.tokens
    input_mask[r, :n + m] = True
    policy_mask[r, n:n + m] = True
    advantages[r, n:n + m] = adv[r]
    old_logprobs[r, n:n + m] = c.logprobs
  batch = batch_lib.batch_from_numpy(tokens, policy_mask, advantages, old_logprobs, input_mask=input_mask,
                                     group_ids=np.arange(P * G) // G)
  return GeneratorRollout(batch=batch, rewards=rewards, checked=checked)


def audit(source, params, checker: generator_lib.TaskChecker, solver, seeds: Sequence[int], *,
          band: tuple[int, int] = (1, 3), first_index: int = 0) -> tuple[dict[str, float], list[corpus_lib.Record]]:
  """Real-solver audit of one generation per seed under `params` (module docstring); returns (metrics, records).

  Solver attempts of audit task j use index `first_index + j` (its rollout keys), so audits of different
  steps can use disjoint indices.
  """
  _, completions = source.sample(params, seeds)
  records = []
  for j, (s, c) in enumerate(zip(seeds, completions)):
    reply = source.chat.decode(c.tokens, skip_special_tokens=True)
    checked = checker.check(generator_lib.extract_task_source(reply))
    rec = corpus_lib.Record(index=first_index + j, seed=s, reply=reply, text=checked.text, valid=checked.valid,
                            reason=checked.reason, family=checked.family, norm_hash=checked.norm_hash)
    if checked.valid:
      results = solver.attempts(checked.task, s, first_index + j)
      rec.passes, rec.attempts = int(sum(results)), len(results)
      rec.label = int(corpus_lib.in_band(rec.passes, band))
    records.append(rec)
  valid = [r for r in records if r.valid]
  metrics = {"audit/frontier_utility": sum(r.label for r in valid) / len(records),
             "audit/validity": len(valid) / len(records),
             "audit/all_solved_share": float(np.mean([r.passes == r.attempts for r in valid])) if valid else 0.0,
             "audit/top_family_share": _top_share([r.family for r in valid]),
             "audit/self_bleu": diversity.self_bleu([r.text for r in valid]),
             "audit/distinct_3": diversity.distinct_n([r.text for r in valid], 3)}
  return metrics, records
