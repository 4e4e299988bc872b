"""Cold-start SFT: `python launch/sft.py --config configs/default.py [--config.<field>=<value> ...]`.

Fine-tunes `model.base` on the train-split tasks' trusted solutions, saves a HF folder at
`sft.checkpoint_dir` (default `<workdir>/sft`) and, with `precheck.enabled`, prints the turn-1
pass rate on the RL task pool.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from launch import cli  # noqa: E402
from leap_jax.train import sft  # noqa: E402


def main(argv):
  cfg = cli.train_config(argv)
  summary = sft.cold_start(cfg, echo=lambda s: print(s, flush=True), measure=cfg.precheck.enabled)
  print(f"saved {summary['dir']} after {summary['seconds']:.0f} s", flush=True)


if __name__ == "__main__":
  main(sys.argv)
