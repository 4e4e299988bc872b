"""Held-out evaluation: `python launch/eval.py --config configs/default.py [--config.<field>=<value> ...]`.

One trajectory per held-out problem (`heldout.split`, `heldout.levels`), every unsolved trajectory gets
all `heldout.num_turns` turns whatever the method (no pruning); prints Acc@1..Acc@T. Evaluates the
latest RL checkpoint in the workdir when there is one, else the starting policy.

With `--config.tasks.kernelbench_dir=DIR` the problems are the eval split of that KernelBench clone at
`tasks.levels` (the same protocol), and it prints per level Acc@1..Acc@T and, where timed (a GPU),
fast_p for p in 0, 1, 1.5, 2 (`kernels_eval.kernelbench.metrics`); written to
`<workdir>/kernelbench_eval.json`.
"""
import contextlib
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from launch import cli  # noqa: E402
from kernels_eval.kernelbench import metrics as kernelbench_metrics  # noqa: E402
from leap_jax.metrics import curves  # noqa: E402
from leap_jax.train import build  # noqa: E402
from leap_jax.train import checks  # noqa: E402
from leap_jax.train import loop  # noqa: E402


def kernelbench_eval(cfg, echo=print) -> dict:
  """Acc@t per level and fast_p of the latest checkpoint on the KernelBench eval split (one trajectory per
  problem, KernelBench's protocol, whatever `heldout.samples` says)."""
  policy, step = loop.latest_policy(cfg)
  h = cfg.heldout
  with contextlib.ExitStack() as stack:
    evaluator = stack.enter_context(build.make_evaluator(cfg.evaluator))
    tasks = build.kernelbench_tasks(cfg.tasks, "eval", evaluator, echo)
    echo(f"KernelBench evaluation of step {step} on {len(tasks)} problems, {h.num_turns} turns")
    result = checks.heldout_accuracy(build.Rollouts.of(cfg), policy, evaluator, tasks, h.num_turns, h.temperature)
  levels = {t.id: t.level for t in tasks}
  result["per_level"] = kernelbench_metrics.per_level(levels, result["solved_by_turn"], h.num_turns,
                                                      result["speedup_at_solve"])
  result["step"] = step
  workdir = pathlib.Path(cfg.workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "kernelbench_eval.json").write_text(json.dumps(result, indent=2))
  return result


def main(argv):
  cfg = cli.train_config(argv)
  echo = lambda s: print(s, flush=True)  # noqa: E731
  if cfg.tasks.kernelbench_dir:
    result = kernelbench_eval(cfg, echo)
    for level, row in result["per_level"].items():
      print(json.dumps({"level": level, **row}), flush=True)
    return
  result = loop.evaluate_checkpoint(cfg, echo=echo)
  print(json.dumps({**curves.accuracies(result), "step": result["step"]}), flush=True)


if __name__ == "__main__":
  main(sys.argv)
