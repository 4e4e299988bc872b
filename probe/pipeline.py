"""Builds PROPEL's parts from a config (configs/propel_cpu.py): models, generator source, solver, checker, paths."""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Any

import ml_collections

import kernels_eval
from kernels_eval import schema
from kernels_eval import validate
from leap_jax.models import pretrained
from leap_jax.rollout import harness
from leap_jax.sampling import ChatFormat
from leap_jax.sampling import SamplingParams
from leap_jax.train import loop
from leap_jax.train import optim
from probe import activations
from probe import generator as generator_lib
from probe import generator_sft
from probe import sources


SFT_RECORD = "generator.json"  # in the SFT folder: which generator it holds (`generator_id`)


def workdir(cfg) -> pathlib.Path:
  return pathlib.Path(cfg.workdir)


def corpus_dir(cfg) -> pathlib.Path:
  return pathlib.Path(cfg.corpus.dir) if cfg.corpus.dir else workdir(cfg) / "corpus"


def probe_dir(cfg) -> pathlib.Path:
  return workdir(cfg) / "probe"


def export_dir(cfg) -> pathlib.Path:
  return pathlib.Path(cfg.rl.export_dir) if cfg.rl.export_dir else workdir(cfg) / "generated_tasks"


def evaluator_version() -> str:
  return f"kernels_eval schema {schema.SCHEMA_VERSION}, task verdict {validate.VERDICT_VERSION}"


def scale_note(cfg) -> str:
  if cfg.scale == "smoke":
    return "[smoke-scale result: CPU sizes, not comparable to the paper's numbers]"
  return "[paper-scale sizes]"


def load_model(section: ml_collections.ConfigDict, seed: int):
  """(Transformer, tokenizer) of a `model` section (see configs/default.py)."""
  return loop.load_base_model(ml_collections.ConfigDict({"model": section, "seed": seed}))


def model_id(section: ml_collections.ConfigDict) -> str:
  return str(section.base) if section.base != "random" else f"random-{section.arch.get('hidden_size')}"


def generator_sft_dir(cfg) -> pathlib.Path:
  return workdir(cfg) / "generator_sft"


def check_generator_model(cfg) -> None:
  """Raises a clear error when `generator.model.base` is unset (configs/propel_h200.py leaves it to the command
  line) or names no embedded model, folder or file."""
  base = cfg.generator.model.base
  if not base:
    raise ValueError("generator.model.base is not set: pass a local HF folder of an instruct model, e.g. "
                     "--config.generator.model.base=/path/to/Qwen2.5-3B-Instruct (configs/propel_h200.py runs "
                     "no cold-start SFT, and the embedded 135M model answers the generator prompt in prose "
                     "without it)")
  if base not in pretrained.EMBEDDED and base != "random" and not os.path.exists(base):
    raise FileNotFoundError(f"generator.model.base {base!r} does not exist: pass a local HF folder "
                            "(config.json, safetensors, tokenizer files)")


def generator_id(cfg) -> str:
  """Names the frozen reference generator: the base model, and its cold-start SFT when enabled (with a hash
  of the suite task files it learns from, so a change of the task format names a new generator)."""
  check_generator_model(cfg)
  g = cfg.generator
  if not g.sft.enabled:
    return model_id(g.model)
  data = hashlib.sha256("\0".join(generator_lib.suite_examples(tuple(g.levels))).encode()).hexdigest()[:12]
  return (f"{model_id(g.model)}+sft(levels={list(g.levels)},shots={g.num_shots},steps={g.sft.steps},"
          f"batch={g.sft.batch_size},lr={g.sft.optim.learning_rate:g},seed={cfg.seed},data={data})")


def load_generator(cfg, echo=print):
  """(Transformer, tokenizer) of the frozen reference generator: `generator.model`, or its cold-start SFT
  (`generator.sft`, probe/generator_sft.py) trained into <workdir>/generator_sft on first use."""
  check_generator_model(cfg)
  g = cfg.generator
  if not g.sft.enabled:
    return load_model(g.model, cfg.seed)
  folder = generator_sft_dir(cfg)
  if (folder / "config.json").is_file():
    record = folder / SFT_RECORD
    made_as = json.loads(record.read_text()).get("generator") if record.is_file() else None
    if made_as != generator_id(cfg):
      raise ValueError(f"{folder} holds the generator {made_as!r}, but this config's generator is "
                       f"{generator_id(cfg)!r}: remove the folder (it is retrained on first use) or change workdir")
    return load_model(_with_base(g.model, str(folder)), cfg.seed)
  model, tokenizer = load_model(g.model, cfg.seed)
  echo(f"no generator SFT checkpoint in {folder}: running the generator's cold-start SFT first")
  summary = generator_sft.cold_start(
      model, tokenizer, ChatFormat(tokenizer), folder, levels=tuple(g.levels), num_shots=g.num_shots,
      steps=g.sft.steps, batch_size=g.sft.batch_size, optimizer=optim.make_optimizer(g.sft.optim), seed=cfg.seed,
      per_task=g.sft.per_task, echo=echo)
  (folder / SFT_RECORD).write_text(json.dumps({"generator": generator_id(cfg), **summary}, indent=1))
  echo(f"generator SFT done in {summary['seconds']:.0f} s, final nll {summary['final_nll']:.4f} -> {folder}")
  return model, tokenizer


def _with_base(section: ml_collections.ConfigDict, base: str) -> ml_collections.ConfigDict:
  section = section.copy_and_resolve_references()
  section.base = base
  return section


def make_source(cfg, model, tokenizer) -> sources.ModelTaskSource:
  g = cfg.generator
  policy = loop.Policy.from_model(model, tokenizer, cache_len=g.max_context_len)
  levels = tuple(g.levels)
  return sources.ModelTaskSource(policy.sampler, policy.params, policy.chat, generator_lib.suite_examples(levels),
                                 num_shots=g.num_shots, levels=levels, max_new_tokens=g.max_new_tokens,
                                 sampling=SamplingParams(temperature=g.temperature, top_p=g.top_p))


def make_solver(cfg, evaluator, seed: int | None = None) -> sources.RolloutSolver:
  s = cfg.solver
  if s.model.base not in pretrained.EMBEDDED and s.model.base != "random" and not os.path.exists(s.model.base):
    raise FileNotFoundError(f"solver.model.base {s.model.base!r} does not exist: train the LEAP solver first "
                            "(launch/train.py writes <workdir>/policy) or point it at a HF folder")
  model, tokenizer = load_model(s.model, cfg.seed)
  policy = loop.Policy.from_model(model, tokenizer, cache_len=s.max_context_len)
  settings = harness.RolloutSettings(num_problems=1, group_size=s.attempts, num_turns=s.num_turns,
                                     max_new_tokens=s.max_new_tokens, context=s.context, temperature=s.temperature,
                                     top_p=s.top_p)
  return sources.RolloutSolver(policy, evaluator, settings, attempts=s.attempts, lang=cfg.lang,
                               seed=cfg.seed if seed is None else seed, episode_mode=s.episode_mode,
                               checkpoint=model_id(s.model), evaluator_version=evaluator_version())


def make_checker(cfg, *, remember: bool = True) -> generator_lib.TaskChecker:
  """Validity checks for generations at `generator.levels` (suite tasks count as known)."""
  return generator_lib.TaskChecker(levels=tuple(cfg.generator.levels), remember=remember)


def make_evaluator(cfg) -> kernels_eval.Evaluator:
  return kernels_eval.Evaluator(workers=cfg.evaluator.workers, timeout_s=cfg.evaluator.timeout_s or None,
                               isolation=cfg.evaluator.isolation)


def make_extractor(cfg, model, tokenizer, layer: int | None) -> activations.ActivationExtractor:
  return activations.ActivationExtractor(model, tokenizer, model_id=generator_id(cfg), layer=layer,
                                         cache_dir=workdir(cfg) / "features", max_tokens=cfg.probe.max_tokens)


def corpus_metadata(cfg) -> dict[str, Any]:
  g = cfg.generator
  return {"generator": {"model": generator_id(cfg), "levels": list(g.levels), "num_shots": g.num_shots,
                        "max_new_tokens": g.max_new_tokens,
                        "temperature": g.temperature, "top_p": g.top_p},
          "evaluator_version": evaluator_version(), "lang": cfg.lang}
