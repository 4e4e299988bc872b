"""Writes a run's latest RL checkpoint as a HF folder: `python launch/export_policy.py --config configs/default.py`.

The folder (default `<workdir>/policy`, or `--out DIR`) loads wherever a model is named by path: `model.base`,
`sft.checkpoint_dir`, and the PROPEL solver (`solver.model.base` in configs/propel_cpu.py). `launch/train.py`
writes it itself at the end of a run (`checkpoint.export_hf`); this command exports any run that stopped early.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from absl import flags  # noqa: E402

from launch import cli  # noqa: E402
from leap_jax.train import checks  # noqa: E402
from leap_jax.train import loop  # noqa: E402

flags.DEFINE_string("out", "", "output folder (default <workdir>/policy)")


def main(argv):
  cfg = cli.train_config(argv)
  policy, step = loop.latest_policy(cfg)
  out = checks.export_policy(policy, flags.FLAGS.out or pathlib.Path(cfg.workdir) / "policy")
  print(f"policy of step {step} written to {out}", flush=True)


if __name__ == "__main__":
  main(sys.argv)
