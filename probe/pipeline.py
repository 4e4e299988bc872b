"""Builds PROPEL's parts from its config sections (probe/config.py): models, generator source, solver, checker,
feature extractor, paths."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from typing import Any

from kernels_eval import schema
from kernels_eval import validate
from leap_jax.models import pretrained
from leap_jax.rollout import harness
from leap_jax.sampling import ChatFormat
from leap_jax.sampling import SamplingParams
from leap_jax.train import build
from leap_jax.train import optim
from leap_jax.train.config import ModelSpec
from probe import activations
from probe import generator as generator_lib
from probe import generator_sft
from probe import sources
from probe.config import GeneratorConfig, PropelConfig, SolverConfig


SFT_RECORD = "generator.json"  # in the SFT folder: which generator it holds (`generator_id`)


def probe_dir(config: PropelConfig) -> pathlib.Path:
  return pathlib.Path(config.workdir) / "probe"


def generator_sft_dir(workdir: str) -> pathlib.Path:
  return pathlib.Path(workdir) / "generator_sft"


def evaluator_version() -> str:
  return f"kernels_eval schema {schema.SCHEMA_VERSION}, task verdict {validate.VERDICT_VERSION}"


def check_generator_model(spec: ModelSpec) -> None:
  """Raises a clear error when `generator.model.base` is unset (configs/propel_h200.py leaves it to the command
  line) or names no embedded model, folder or file."""
  if not spec.base:
    raise ValueError("generator.model.base is not set: pass a local HF folder of an instruct model, e.g. "
                     "--config.generator.model.base=/path/to/Qwen2.5-3B-Instruct (configs/propel_h200.py runs "
                     "no cold-start SFT, and the embedded 135M model answers the generator prompt in prose "
                     "without it)")
  if spec.base not in pretrained.EMBEDDED and spec.base != "random" and not os.path.exists(spec.base):
    raise FileNotFoundError(f"generator.model.base {spec.base!r} does not exist: pass a local HF folder "
                            "(config.json, safetensors, tokenizer files)")


def generator_id(g: GeneratorConfig, seed: int) -> str:
  """Names the frozen reference generator: the base model, and its cold-start SFT when enabled (with a hash
  of the suite task files it learns from, so a change of the task format names a new generator)."""
  check_generator_model(g.model)
  if not g.sft.enabled:
    return g.model.model_id
  data = hashlib.sha256("\0".join(generator_lib.suite_examples(g.levels)).encode()).hexdigest()[:12]
  return (f"{g.model.model_id}+sft(levels={list(g.levels)},shots={g.num_shots},steps={g.sft.steps},"
          f"batch={g.sft.batch_size},lr={g.sft.optim.learning_rate:g},seed={seed},data={data})")


def load_generator(g: GeneratorConfig, workdir: str, seed: int, echo=print):
  """(Transformer, tokenizer) of the frozen reference generator: `generator.model`, or its cold-start SFT
  (`generator.sft`, probe/generator_sft.py) trained into <workdir>/generator_sft on first use."""
  check_generator_model(g.model)
  if not g.sft.enabled:
    return build.load_model(g.model, seed)
  folder = generator_sft_dir(workdir)
  if build.has_checkpoint(folder):
    record = folder / SFT_RECORD
    made_as = json.loads(record.read_text()).get("generator") if record.is_file() else None
    if made_as != generator_id(g, seed):
      raise ValueError(f"{folder} holds the generator {made_as!r}, but this config's generator is "
                       f"{generator_id(g, seed)!r}: remove the folder (it is retrained on first use) or change "
                       "workdir")
    return build.load_model(dataclasses.replace(g.model, base=str(folder)), seed)
  model, tokenizer = build.load_model(g.model, seed)
  echo(f"no generator SFT checkpoint in {folder}: running the generator's cold-start SFT first")
  summary = generator_sft.cold_start(
      model, tokenizer, ChatFormat(tokenizer), folder, levels=g.levels, num_shots=g.num_shots,
      steps=g.sft.steps, batch_size=g.sft.batch_size, optimizer=optim.make_optimizer(g.sft.optim), seed=seed,
      per_task=g.sft.per_task, echo=echo)
  (folder / SFT_RECORD).write_text(json.dumps({"generator": generator_id(g, seed), **summary}, indent=1))
  echo(f"generator SFT done in {summary['seconds']:.0f} s, final nll {summary['final_nll']:.4f} -> {folder}")
  return model, tokenizer


def make_source(g: GeneratorConfig, model, tokenizer) -> sources.ModelTaskSource:
  policy = build.Policy.from_model(model, tokenizer, cache_len=g.max_context_len)
  return sources.ModelTaskSource(policy.sampler, policy.params, policy.chat, generator_lib.suite_examples(g.levels),
                                 num_shots=g.num_shots, levels=g.levels, max_new_tokens=g.max_new_tokens,
                                 sampling=SamplingParams(temperature=g.temperature, top_p=g.top_p))


def make_solver(s: SolverConfig, evaluator, lang: str, seed: int, *, rollout_seed: int | None = None
                ) -> sources.RolloutSolver:
  """The solver that labels tasks: `solver.model` (initialised from `seed` when random) sampling with the rollout
  keys of `rollout_seed` (default `seed`)."""
  if s.model.base not in pretrained.EMBEDDED and s.model.base != "random" and not os.path.exists(s.model.base):
    raise FileNotFoundError(f"solver.model.base {s.model.base!r} does not exist: train the LEAP solver first "
                            "(launch/train.py writes <workdir>/policy) or point it at a HF folder")
  model, tokenizer = build.load_model(s.model, seed)
  policy = build.Policy.from_model(model, tokenizer, cache_len=s.max_context_len)
  settings = harness.RolloutSettings(num_problems=1, group_size=s.attempts, num_turns=s.num_turns,
                                     max_new_tokens=s.max_new_tokens, context=s.context, temperature=s.temperature,
                                     top_p=s.top_p)
  return sources.RolloutSolver(policy, evaluator, settings, attempts=s.attempts, lang=lang,
                               seed=seed if rollout_seed is None else rollout_seed,
                               episode_mode=s.episode_mode, checkpoint=s.model.model_id,
                               evaluator_version=evaluator_version())


def make_checker(g: GeneratorConfig, *, remember: bool = True) -> generator_lib.TaskChecker:
  """Validity checks for generations at `generator.levels` (suite tasks count as known)."""
  return generator_lib.TaskChecker(levels=g.levels, remember=remember)


def make_extractor(config: PropelConfig, model, tokenizer, layer: int | None) -> activations.ActivationExtractor:
  """The frozen generator's activation extractor, its features cached under <workdir>/features."""
  return activations.ActivationExtractor(model, tokenizer, model_id=generator_id(config.generator, config.seed),
                                         layer=layer, cache_dir=pathlib.Path(config.workdir) / "features",
                                         max_tokens=config.probe.max_tokens)


def corpus_metadata(config: PropelConfig) -> dict[str, Any]:
  g = config.generator
  return {"generator": {"model": generator_id(g, config.seed), "levels": list(g.levels), "num_shots": g.num_shots,
                        "max_new_tokens": g.max_new_tokens, "temperature": g.temperature, "top_p": g.top_p},
          "evaluator_version": evaluator_version(), "lang": config.lang}
