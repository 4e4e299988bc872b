"""Plots the main training curves of a workdir: `python launch/plot.py WORKDIR [--out DIR]`."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from leap_jax.metrics.plots import plot_workdir  # noqa: E402


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("workdir", help="training workdir holding metrics.jsonl")
  parser.add_argument("--out", default=None, help="output folder (default: WORKDIR/plots)")
  args = parser.parse_args(argv)
  paths = plot_workdir(args.workdir, args.out)
  if not paths:
    print(f"no plottable metrics in {args.workdir}", file=sys.stderr)
    return 1
  print("\n".join(paths))
  return 0


if __name__ == "__main__":
  sys.exit(main())
