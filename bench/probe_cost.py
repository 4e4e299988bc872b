"""Cost of the probe reward vs real solver labels on the same tasks.

  python bench/probe_cost.py --config configs/propel_cpu.py [--num_tasks 8] [--config.<f>=<v> ...]

Times, on `num_tasks` tasks of the embedded suite (levels 1-3, rendered for the config's language):
  probe: one forward pass of the frozen generator over the task texts + pooling + the probe (warm: timed on a
         second call with the same shapes, the feature cache off);
  solver: K attempts per task through the rollout harness (sampling + sandboxed evaluation), as the corpus does
         (warm: after one untimed call on the first task with other sampling keys).
Prints both times and their ratio. The probe is <workdir>/probe/probe.npz when present, else an untrained linear
probe of the same shape (its cost does not depend on its weights).
"""
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from absl import flags  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import kernels_eval  # noqa: E402
from launch import cli  # noqa: E402
from leap_jax.train import build  # noqa: E402
from probe import activations  # noqa: E402
from probe import linear  # noqa: E402
from probe import pipeline  # noqa: E402

flags.DEFINE_integer("num_tasks", 8, "tasks timed on both sides")


def main(argv):
  cfg = cli.propel_config(argv)
  n = flags.FLAGS.num_tasks
  tasks = [t for t in kernels_eval.load_tasks() if t.level >= 1 and cfg.lang in t.solutions]
  if len(tasks) < n:
    raise SystemExit(f"error: num_tasks={n} but the suite has {len(tasks)} {cfg.lang} tasks at levels 1-3")
  timed = tasks[:n]
  model, tokenizer = pipeline.load_generator(cfg.generator, cfg.workdir, cfg.seed)
  extractor = activations.ActivationExtractor(model, tokenizer, model_id="bench", batch_size=n,
                                              max_tokens=cfg.probe.max_tokens)
  path = pipeline.probe_dir(cfg) / "probe.npz"
  probe = linear.load_probe(path) if path.is_file() else linear.ProbeParams(
      mean=jnp.zeros(extractor.width), scale=jnp.ones(extractor.width),
      weights={"w": jnp.zeros(extractor.width), "b": jnp.zeros(())})

  def probe_reward(batch):
    feats = extractor([kernels_eval.render_task(t, cfg.lang) for t in batch])
    return linear.probe_predict(probe, feats).block_until_ready()

  probe_reward(timed)
  start = time.perf_counter()
  probe_reward(timed)
  probe_s = time.perf_counter() - start
  print(f"probe reward for {n} tasks: {probe_s:.3f} s ({'trained' if path.is_file() else 'untrained'} probe, "
        f"layer {extractor.layer})", flush=True)
  with build.make_evaluator(cfg.evaluator) as evaluator:
    solver = pipeline.make_solver(cfg.solver, evaluator, cfg.lang, cfg.seed)
    solver.attempts(timed[0], 0, 0)
    start = time.perf_counter()
    passes = [sum(solver.attempts(t, 0, i + 1)) for i, t in enumerate(timed)]
    solver_s = time.perf_counter() - start
  k = cfg.solver.attempts
  print(f"K={k} solver attempts on the same {n} tasks: {solver_s:.1f} s (passes per task {passes})")
  print(f"ratio solver / probe: {solver_s / probe_s:.0f}x " + cfg.scale_note)


if __name__ == "__main__":
  main(sys.argv)
