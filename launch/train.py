"""RL training: `python launch/train.py --config configs/default.py [--config.<field>=<value> ...]`.

With `sft.enabled` and no SFT checkpoint yet, runs the cold-start SFT first (launch/sft.py).
"""
import os
import pathlib
import sys

import tqdm

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from launch import cli  # noqa: E402
from leap_jax.train import build  # noqa: E402
from leap_jax.train import loop  # noqa: E402
from leap_jax.train import sft  # noqa: E402


def _echo(line: str) -> None:
  """Prints above the progress bar, flushed so that a redirected log shows each line as it happens."""
  tqdm.tqdm.write(line)
  sys.stdout.flush()


def main(argv):
  cfg = cli.train_config(argv)
  if cfg.distributed.enabled:
    import jax  # pylint: disable=import-outside-toplevel
    jax.distributed.initialize(cfg.distributed.coordinator_address, cfg.distributed.num_processes,
                               cfg.distributed.process_id)
  if cfg.sft.enabled and not build.has_checkpoint(cfg.sft.checkpoint_dir):
    print(f"no SFT checkpoint in {cfg.sft.checkpoint_dir}: running cold-start SFT first", flush=True)
    summary = sft.cold_start(cfg, echo=lambda s: print(s, flush=True))
    print(f"SFT done in {summary['seconds']:.0f} s, final nll {summary['final_nll']:.4f}", flush=True)
  result = loop.train(cfg, echo=_echo)
  last = result.history[-1] if result.history else {}
  print(f"done in {result.seconds:.0f} s; workdir {os.path.abspath(cfg.workdir)}; final step metrics: "
        + ", ".join(f"{k}={last[k]:.4g}" for k in ("pass_rate/turn_1", "groups/activated_share", "reward/mean", "loss", "grad_norm") if k in last),
        flush=True)


if __name__ == "__main__":
  main(sys.argv)
