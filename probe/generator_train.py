"""PROPEL's generator RL run: GRPO steps on the probe reward, with metrics, checkpoints and real-solver audits
as hooks (`leap_jax.train.hooks`), and the valid generated tasks exported as a task folder at the end.

One step: P prompt seeds x G generations under the current generator (`generator_rl.sample_generations`),
then one learner step with the k3 KL to the frozen reference (`learner.kl_beta`). Audits run before the first
step, every `rl.audit_every` steps and after the last, on M fixed-seed generations.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from leap_jax.metrics.writer import MetricsWriter
from leap_jax.train import build
from leap_jax.train import hooks as hooks_lib
from leap_jax.train.checkpoint import Checkpointer
from leap_jax.train.learner import Learner
from leap_jax.train.optim import make_optimizer
from probe import corpus
from probe import generator
from probe import generator_rl
from probe import pipeline
from probe import reward as reward_lib
from probe.config import PropelConfig

AUDIT_SEED_OFFSET = 1 << 21  # audit task j uses task_seed(seed, AUDIT_SEED_OFFSET + j) at every audit


@dataclasses.dataclass
class GeneratorRun:
  """The built parts of a generator run and its moving state."""
  config: PropelConfig
  source: Any
  reward: reward_lib.ProbeReward
  checker: Any
  learner: Learner
  ref_params: Any
  state: Any
  exported: list[str]
  directory: pathlib.Path


def setup(config: PropelConfig, probes: Sequence[Any], layer: int, echo: Callable[[str], None]) -> GeneratorRun:
  """The generator (its SFT when enabled), the probe reward on the frozen reference's activations, the learner
  and the train state (restored from `<workdir>/generator/checkpoints` when there is one)."""
  model, tokenizer = pipeline.load_generator(config.generator, config.workdir, config.seed, echo)
  source = pipeline.make_source(config.generator, model, tokenizer)
  graphdef = source.sampler.graphdef
  ref_params = jax.tree.map(jnp.array, source.params)
  extractor = pipeline.make_extractor(config, nnx.merge(graphdef, ref_params), tokenizer, layer)
  reward = reward_lib.ProbeReward(extractor, probes, lang=config.lang, r_bad=config.probe.r_bad)
  learner = Learner.for_model(graphdef, make_optimizer(config.optim), config.learner,
                              temperature=config.generator.temperature)
  directory = pathlib.Path(config.workdir) / "generator"
  return GeneratorRun(config, source, reward, pipeline.make_checker(config.generator, remember=False), learner,
                      ref_params, None, [], directory)


def train_generator(config: PropelConfig, probes: Sequence[Any], layer: int,
                    echo: Callable[[str], None] = print) -> dict[int, dict[str, float]]:
  """Runs `rl.steps` generator steps; returns the audits {step: metrics} (also in `<workdir>/generator`)."""
  run = setup(config, probes, layer, echo)
  with build.make_evaluator(config.evaluator) as evaluator:
    audits = run_steps(run, evaluator, echo)
  export(run, audits, echo)
  return audits


def run_steps(run: GeneratorRun, evaluator, echo: Callable[[str], None]) -> dict[int, dict[str, float]]:
  """The steps from the latest checkpoint to `rl.steps`, hooks after each, audits before the first and after the
  last; returns the audits."""
  config = run.config
  c = config.checkpoint
  checkpointer = Checkpointer(run.directory, every=c.every, keep=c.keep, async_save=c.async_save)
  restored = checkpointer.restore_latest(run.learner.abstract_state(run.source.params))
  run.state = (restored["state"] if restored else
               run.learner.init_state(jax.tree.map(jnp.array, run.source.params), config.seed))
  run.exported = list(restored["sampler"].get("valid_texts", [])) if restored else []
  start = int(run.state.step)
  solver = pipeline.make_solver(config.solver, evaluator, config.lang, config.seed, rollout_seed=config.seed + 1)
  audits: dict[int, dict[str, float]] = {}
  with MetricsWriter(run.directory, tensorboard=config.metrics.tensorboard,
                     progress_bar=config.metrics.progress_bar, total_steps=config.rl.steps,
                     initial_step=start) as writer, contextlib.closing(checkpointer):
    hooks = generator_hooks(run, writer, checkpointer, solver, audits, echo)
    if start % config.rl.audit_every == 0 and start < config.rl.steps:
      hooks.run(hooks_lib.StepInfo(start, run.state, {}), names=("audit",))
    for step in range(start, config.rl.steps):
      metrics = generator_step(run, step)
      hooks.run(hooks_lib.StepInfo(step + 1, run.state, metrics, final=step + 1 == config.rl.steps))
    done = int(run.state.step)
    checkpointer.save(done, run.state, {"valid_texts": run.exported}, config.to_dict(), force=True)
    if done not in audits:
      hooks.run(hooks_lib.StepInfo(done, run.state, {}, final=True), names=("audit",))
  return audits


def generator_step(run: GeneratorRun, step: int) -> dict[str, float]:
  """Samples, scores and learns one step; returns its metrics."""
  config = run.config
  seeds = generator_rl.step_seeds(config.seed, step, config.rl.num_prompts)
  out = generator_rl.sample_generations(run.source, run.state.params, run.checker, run.reward, seeds,
                                        config.rl.group_size, jax.random.fold_in(jax.random.key(config.seed), step),
                                        pad_id=run.source.sampler.pad_id)
  run.exported.extend(c.text for c in out.checked if c.valid)
  run.state, learn = run.learner.step(run.state, out.batch, ref_params=run.ref_params)
  return {**out.metrics(), **{f"learner/{k}": v for k, v in learn.items()}}


def generator_hooks(run: GeneratorRun, writer: MetricsWriter, checkpointer: Checkpointer, solver,
                    audits: dict[int, dict[str, float]], echo: Callable[[str], None]) -> hooks_lib.Hooks:
  """After each step: the metrics row, a progress line, the checkpoint (every `checkpoint.every` steps; the loop
  forces the last), and the audit on its schedule."""
  config = run.config
  audit_seeds = [corpus.task_seed(config.seed, AUDIT_SEED_OFFSET + j) for j in range(config.rl.audit_tasks)]

  def audit(info: hooks_lib.StepInfo) -> None:
    metrics, records = generator_rl.audit(run.source, info.state.params, run.checker, solver, audit_seeds,
                                          band=config.corpus.band, first_index=AUDIT_SEED_OFFSET)
    audits[info.step] = metrics
    writer.write(info.step, metrics)
    (run.directory / f"audit_step{info.step}.jsonl").write_text(
        "".join(json.dumps(r.__dict__) + "\n" for r in records))
    echo(f"audit at step {info.step}: " + ", ".join(f"{k}={v:.3f}" for k, v in metrics.items()) + " "
         + config.scale_note)

  def progress(info: hooks_lib.StepInfo) -> None:
    echo(f"step {info.step}: " + ", ".join(f"{k}={info.metrics[k]:.4g}" for k in ("reward/mean", "validity",
                                                                                   "top_family_share")))

  hooks = hooks_lib.Hooks()
  hooks.add("metrics", lambda info: writer.write(info.step, info.metrics))
  hooks.add("progress", progress)
  hooks.add("checkpoint", lambda info: checkpointer.save(info.step, info.state, {"valid_texts": run.exported},
                                                         config.to_dict()))
  hooks.add("audit", audit, every=config.rl.audit_every, at_last=True)
  return hooks


def export(run: GeneratorRun, audits: dict[int, dict[str, float]], echo: Callable[[str], None]) -> None:
  """Writes the valid generated tasks as a task folder and the audits; echoes the first and last audit."""
  config = run.config
  paths = generator.export_tasks(run.exported, config.rl.export_dir)
  (run.directory / "audits.json").write_text(json.dumps(audits, indent=1))
  echo(f"exported {len(paths)} valid generated tasks to {config.rl.export_dir} (kernels_eval.load_tasks)")
  if len(audits) > 1:
    first, last = audits[min(audits)], audits[max(audits)]
    echo("audit before -> after: " + ", ".join(f"{k} {first[k]:.3f} -> {last[k]:.3f}" for k in first) + " "
         + config.scale_note)
