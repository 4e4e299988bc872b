"""PROPEL generator RL: `python launch/train_generator.py --config configs/propel_cpu.py [--config.<f>=<v> ...]`.

GRPO on the generator with reward = the probe logit on its reward scale (min over two probes with
`probe.second_probe`) of each valid generated task, r_bad otherwise, and a k3 KL to the frozen reference
(learner.kl_beta). A probe without demonstrated skill (fit_probe.py marks it ineligible) is refused unless
--config.probe.allow_ineligible=True. Before the first step, every `rl.audit_every` steps and at the end, M
fixed-seed generations are audited with real solver runs (same solver and pass definition as the corpus), with
the diversity of the valid tasks (Self-BLEU, distinct-3). Valid generated tasks are exported to a task folder that
`kernels_eval.load_tasks(folder)` reads. Checkpoints and metrics go to <workdir>/generator.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from launch import cli  # noqa: E402
from probe import generator_train  # noqa: E402
from probe import pipeline  # noqa: E402
from probe import selection  # noqa: E402


def main(argv):
  cfg = cli.propel_config(argv)
  paths = [pipeline.probe_dir(cfg) / "probe.npz"] + ([cfg.probe.second_probe] if cfg.probe.second_probe else [])
  try:
    loaded = [selection.usable_probe(p, allow_ineligible=cfg.probe.allow_ineligible) for p in paths]
  except ValueError as e:
    raise SystemExit(f"error: {e}") from e
  layers = [c["layer"] for _, c in loaded]
  if len(set(layers)) > 1:
    raise SystemExit(f"error: the probes read layers {layers}; the reward extracts one")
  generator_train.train_generator(cfg, [p for p, _ in loaded], layers[0], echo=lambda s: print(s, flush=True))


if __name__ == "__main__":
  main(sys.argv)
