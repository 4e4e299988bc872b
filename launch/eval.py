"""Held-out evaluation: `python launch/eval.py --config configs/default.py [--config.<field>=<value> ...]`.

One trajectory per held-out problem (`heldout.split`, `heldout.levels`), every unsolved trajectory gets
all `heldout.num_turns` turns whatever the method (no pruning); prints Acc@1..Acc@T. Evaluates the
latest RL checkpoint in the workdir when there is one, else the starting policy.
"""
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from launch import cli  # noqa: E402
from leap_jax.metrics import curves  # noqa: E402
from leap_jax.train import loop  # noqa: E402


def main(argv):
  cfg = cli.train_config(argv)
  result = loop.evaluate_checkpoint(cfg, echo=lambda s: print(s, flush=True))
  print(json.dumps({**curves.accuracies(result), "step": result["step"]}), flush=True)


if __name__ == "__main__":
  main(sys.argv)
