"""PROPEL generator RL: `python launch/train_generator.py --config configs/propel_cpu.py [--config.<f>=<v> ...]`.

GRPO on the generator with reward = the probe logit on its reward scale (min over two probes with
`probe.second_probe`) of each valid generated task, r_bad otherwise, and a k3 KL to the frozen reference
(learner.kl_beta). A probe without demonstrated skill (fit_probe.py marks it ineligible) is refused unless
--config.probe.allow_ineligible=True. Before the first step, every `rl.audit_every` steps and at the end, M
fixed-seed generations are audited with real solver runs (same solver and pass definition as the corpus), with
the diversity of the valid tasks (Self-BLEU, distinct-3). Valid generated tasks are exported to a task folder that
`kernels_eval.load_tasks(folder)` reads. Checkpoints and metrics go to <workdir>/generator.
"""
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from leap_jax.metrics.writer import MetricsWriter  # noqa: E402
from leap_jax.train import loop  # noqa: E402
from leap_jax.train.checkpoint import Checkpointer  # noqa: E402
from leap_jax.train.learner import Learner, LearnerConfig, model_logprob_fn  # noqa: E402
from leap_jax.train.optim import make_optimizer  # noqa: E402
from probe import corpus  # noqa: E402
from probe import generator  # noqa: E402
from probe import generator_rl  # noqa: E402
from probe import pipeline  # noqa: E402
from probe import reward as reward_lib  # noqa: E402
from probe import selection  # noqa: E402

AUDIT_SEED_OFFSET = 1 << 21  # audit task j uses task_seed(seed, AUDIT_SEED_OFFSET + j) at every audit


def main(argv):
  cfg = loop.parse_config(argv)
  echo = lambda s: print(s, flush=True)  # noqa: E731
  paths = [pipeline.probe_dir(cfg) / "probe.npz"] + ([cfg.probe.second_probe] if cfg.probe.second_probe else [])
  try:
    loaded = [selection.usable_probe(p, allow_ineligible=cfg.probe.allow_ineligible) for p in paths]
  except ValueError as e:
    raise SystemExit(f"error: {e}") from e
  probes, chosen = [p for p, _ in loaded], loaded[0][1]
  if any(c["layer"] != chosen["layer"] for _, c in loaded):
    raise SystemExit(f"error: the probes read layers {[c['layer'] for _, c in loaded]}; the reward extracts one")
  model, tokenizer = pipeline.load_generator(cfg, echo)
  source = pipeline.make_source(cfg, model, tokenizer)
  graphdef = source.sampler.graphdef
  ref_params = jax.tree.map(jnp.array, source.params)
  extractor = pipeline.make_extractor(cfg, nnx.merge(graphdef, ref_params), tokenizer, chosen["layer"])
  reward = reward_lib.ProbeReward(extractor, probes, lang=cfg.lang, r_bad=cfg.probe.r_bad)
  checker = pipeline.make_checker(cfg, remember=False)
  learner = Learner(model_logprob_fn(graphdef, temperature=cfg.generator.temperature), make_optimizer(cfg.optim),
                    LearnerConfig.from_configs(cfg.learner, cfg.optim))
  run_dir = pipeline.workdir(cfg) / "generator"
  ckpt = Checkpointer(run_dir, every=cfg.checkpoint.every, keep=cfg.checkpoint.keep,
                      async_save=cfg.checkpoint.async_save)
  restored = ckpt.restore_latest(learner.abstract_state(source.params))
  state = restored["state"] if restored else learner.init_state(jax.tree.map(jnp.array, source.params), cfg.seed)
  exported = list(restored["sampler"].get("valid_texts", [])) if restored else []
  start = int(state.step)
  audit_seeds = [corpus.task_seed(cfg.seed, AUDIT_SEED_OFFSET + j) for j in range(cfg.rl.audit_tasks)]
  audits = {}
  with pipeline.make_evaluator(cfg) as evaluator, MetricsWriter(
      run_dir, tensorboard=cfg.metrics.tensorboard, progress_bar=cfg.metrics.progress_bar,
      total_steps=cfg.rl.steps, initial_step=start) as writer:
    solver = pipeline.make_solver(cfg, evaluator, seed=cfg.seed + 1)

    def run_audit(step):
      metrics, records = generator_rl.audit(source, state.params, checker, solver, audit_seeds,
                                            band=tuple(cfg.corpus.band), first_index=AUDIT_SEED_OFFSET)
      audits[step] = metrics
      writer.write(step, metrics)
      (run_dir / f"audit_step{step}.jsonl").write_text("".join(json.dumps(r.__dict__) + "\n" for r in records))
      echo(f"audit at step {step}: " + ", ".join(f"{k}={v:.3f}" for k, v in metrics.items()) + " "
           + pipeline.scale_note(cfg))

    for step in range(start, cfg.rl.steps):
      if step % cfg.rl.audit_every == 0:
        run_audit(step)
      seeds = generator_rl.step_seeds(cfg.seed, step, cfg.rl.num_prompts)
      out = generator_rl.sample_generations(source, state.params, checker, reward, seeds, cfg.rl.group_size,
                                            jax.random.fold_in(jax.random.key(cfg.seed), step),
                                            pad_id=source.sampler.pad_id)
      exported.extend(c.text for c in out.checked if c.valid)
      state, learn = learner.step(state, out.batch, ref_params=ref_params)
      metrics = {**out.metrics(), **{f"learner/{k}": v for k, v in learn.items()}}
      writer.write(step + 1, metrics)
      echo(f"step {step + 1}: " + ", ".join(f"{k}={metrics[k]:.4g}" for k in ("reward/mean", "validity",
                                                                                "top_family_share")))
      ckpt.save(step + 1, state, {"valid_texts": exported}, cfg.to_dict())
    ckpt.save(int(state.step), state, {"valid_texts": exported}, cfg.to_dict(), force=True)
    if int(state.step) not in audits:
      run_audit(int(state.step))
  ckpt.close()
  paths = generator.export_tasks(exported, pipeline.export_dir(cfg))
  (run_dir / "audits.json").write_text(json.dumps(audits, indent=1))
  echo(f"exported {len(paths)} valid generated tasks to {pipeline.export_dir(cfg)} (kernels_eval.load_tasks)")
  if len(audits) > 1:
    first, last = audits[min(audits)], audits[max(audits)]
    echo("audit before -> after: " + ", ".join(f"{k} {first[k]:.3f} -> {last[k]:.3f}" for k in first) + " "
         + pipeline.scale_note(cfg))


if __name__ == "__main__":
  main(sys.argv)
