"""The model-backed task generator and the real solver used to label tasks.

`ModelTaskSource`: the frozen reference generator; reply j is one sample from the chat-formatted
`generator_prompt(examples, seed=seeds[j])` with sampler key PRNGKey(seeds[j]), so it depends only on its seed.

`RolloutSolver`: K attempts of the LEAP rollout harness on one task. Turn-1 mode (default) samples K single
replies at the solver temperature (method "grpo"); episode mode runs K full T-turn episodes (method
"grpo_mt", continuing until solved). An attempt passes iff some turn's verdict is `correct`; attempts with an
evaluator infrastructure error (after retries) count as failures and are reported in the log.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from leap_jax.rollout import harness
from leap_jax.rollout import methods as methods_lib
from leap_jax.sampling import sampler as sampler_lib
from probe import generator as generator_lib

PASS_DEFINITION = "attempt passes iff any generated turn is judged `correct` by kernels_eval (full stages)"


class ModelTaskSource:
  """Samples task files from a generator model.

  Args:
    sampler: a `leap_jax.sampling.Sampler` of the generator model.
    params: its weights.
    chat: its `ChatFormat`.
    examples: few-shot task files (`generator.suite_examples(levels)`).
    num_shots: examples per prompt.
    levels: the levels the prompt asks for.
    max_new_tokens: reply budget.
    sampling: SamplingParams.
  """

  def __init__(self, sampler, params, chat, examples: Sequence[str], *, num_shots: int = 2,
               levels: Sequence[int] = generator_lib.GENERATED_LEVELS, max_new_tokens: int = 768,
               sampling: sampler_lib.SamplingParams = sampler_lib.SamplingParams()):
    self.sampler, self.params, self.chat = sampler, params, chat
    self.examples = list(examples)
    self.num_shots = num_shots
    self.levels = tuple(levels)
    self.max_new_tokens = max_new_tokens
    self.sampling = sampling

  def prompts(self, seeds: Sequence[int]) -> list[list[int]]:
    return [self.chat.first_turn(generator_lib.generator_prompt(self.examples, num_shots=self.num_shots, seed=s,
                                                                levels=self.levels))
            for s in seeds]

  def sample(self, params, seeds: Sequence[int]) -> tuple[list[list[int]], list[sampler_lib.Completion]]:
    """(prompt ids, completions) of one reply per seed under `params`."""
    prompts = self.prompts(seeds)
    keys = jax.vmap(jax.random.key)(np.asarray(seeds, np.uint32))
    _, completions = self.sampler.start(params, prompts, 1, keys, max_new_tokens=self.max_new_tokens,
                                        sampling=self.sampling)
    return prompts, completions

  def generate(self, seeds: Sequence[int]) -> list[str]:
    _, completions = self.sample(self.params, seeds)
    return [self.chat.decode(c.tokens, skip_special_tokens=True) for c in completions]


class RolloutSolver:
  """K solver attempts per task through `leap_jax.rollout.Rollout`.

  Args:
    policy: `leap_jax.train.build.Policy` of the solver (sampler, chat, params).
    evaluator: `kernels_eval.Evaluator`.
    settings: RolloutSettings of the solver (temperature, max_new_tokens, num_turns, context).
    attempts: K.
    lang: kernel language.
    seed: corpus seed (rollout keys are row_keys(seed, task index, episode, turn)).
    episode_mode: full T-turn episodes instead of turn-1 samples.
    checkpoint: names the solver checkpoint in the corpus metadata.
  """

  def __init__(self, policy, evaluator, settings: harness.RolloutSettings, *, attempts: int, lang: str, seed: int,
               episode_mode: bool = False, checkpoint: str = "", evaluator_version: str = ""):
    method = methods_lib.get_method("grpo_mt" if episode_mode else "grpo")
    self.settings = harness.RolloutSettings(**{**settings.__dict__, "num_problems": 1, "group_size": attempts,
                                               "num_turns": settings.num_turns if episode_mode else 1})
    self.rollout = harness.Rollout(policy.sampler, policy.chat, evaluator, method=method, settings=self.settings,
                                   lang=lang, seed=seed, dcp=(1, attempts))
    self.params = policy.params
    self.metadata: dict[str, Any] = {
        "checkpoint": checkpoint, "attempts": attempts, "mode": "episode" if episode_mode else "turn1",
        "num_turns": self.settings.num_turns, "temperature": self.settings.temperature,
        "top_p": self.settings.top_p, "top_k": self.settings.top_k, "max_new_tokens": self.settings.max_new_tokens,
        "context": self.settings.context, "lang": lang, "pass_definition": PASS_DEFINITION,
        "evaluator_version": evaluator_version, "rollout_seed": seed}

  def attempts(self, task, seed: int, index: int) -> list[bool]:
    del seed  # the rollout keys derive from (corpus seed, index)
    batch = self.rollout.run(self.params, [task], step=index)
    passed = batch.success[0].any(axis=-1) & batch.valid[0]
    return [bool(p) for p in passed]
