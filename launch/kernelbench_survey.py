"""Counts, per level, the problems of a local KernelBench clone that load and evaluate on this machine.

  python launch/kernelbench_survey.py DIR [--levels 1,2] [--workers 2] [--out FILE]

Prints a table (files, parsed, loaded) and each skipped problem's reason; `--out` also writes them as JSON.
Every reference runs once in the sandbox at its check sizes, as `--config.tasks.kernelbench_dir` loading does.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels_eval  # noqa: E402
from kernels_eval.kernelbench import problems  # noqa: E402
from kernels_eval.kernelbench import survey  # noqa: E402


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("folder", help="a KernelBench clone (or its KernelBench folder)")
  parser.add_argument("--levels", default="", help="comma-separated levels (default: all)")
  parser.add_argument("--workers", type=int, default=2, help="sandboxed evaluator workers")
  parser.add_argument("--out", default="", help="also write the result as JSON here")
  args = parser.parse_args(argv)
  levels = tuple(int(x) for x in args.levels.split(",") if x)
  try:
    problems.suite_root(args.folder)
  except problems.ProblemError as e:
    raise SystemExit(f"error: {e}") from None
  with kernels_eval.Evaluator(workers=args.workers) as evaluator:
    result = survey.survey(args.folder, evaluator, levels)
  print(survey.table(result))
  for problem, reason in result["skipped"].items():
    print(f"skipped {problem}: {reason}")
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
