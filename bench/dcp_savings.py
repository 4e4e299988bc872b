"""Cost of DCP: the same config, seed and steps under `leap`, `leap_no_dcp` and `grpo_mt`.

  python bench/dcp_savings.py --config configs/default.py [--config.steps=3 ...]

Prints per step the generated rows and tokens, evaluator calls and wall time of each method, the
ratios leap / other, the held-out Acc@1 and Acc@T of each at the end (launch/eval.py's evaluation), and,
from each run's held-out curve (`heldout.every`, at least 1 here), the training cost at which each method
first reached each Acc@1 level and the time to equal Acc@1 (other / leap at the highest level all
reached). Each method trains in `<workdir>/dcp_savings/<method>` from the same starting policy (the SFT
checkpoint is trained once, in `<workdir>/sft`, when `sft.enabled`).
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from launch import cli  # noqa: E402
from leap_jax.metrics import curves  # noqa: E402
from leap_jax.train import build  # noqa: E402
from leap_jax.train import loop  # noqa: E402
from leap_jax.train.config import TrainConfig  # noqa: E402
from leap_jax.train import sft  # noqa: E402

METHODS = ("leap", "leap_no_dcp", "grpo_mt")
COLUMNS = ("cost/generated_rows", "cost/generated_tokens", "cost/evaluator_calls", "time/step")


def method_config(raw, base: TrainConfig, method: str) -> TrainConfig:
  """The base config under `method`, in its own workdir, from the base run's SFT checkpoint, with a held-out
  curve point every step or more often and no pass-rate checks."""
  cfg = raw.copy_and_resolve_references()
  cfg.method = method
  cfg.sft.checkpoint_dir = base.sft.checkpoint_dir
  cfg.workdir = str(pathlib.Path(base.workdir) / "dcp_savings" / method)
  cfg.precheck.enabled = False
  cfg.heldout.at_end = False
  cfg.heldout.every = max(cfg.heldout.every, 1)
  return cli.to_typed(cfg, TrainConfig.from_dict)


def main(argv):
  raw = cli.parse_config(argv)
  base = cli.to_typed(raw, TrainConfig.from_dict)
  if base.sft.enabled and not build.has_checkpoint(base.sft.checkpoint_dir):
    sft.cold_start(base, echo=lambda s: print(s, flush=True))
  histories, accuracy, heldout_curves = {}, {}, {}
  for method in METHODS:
    cfg = method_config(raw, base, method)
    print(f"== {method}", flush=True)
    histories[method] = loop.train(cfg, echo=lambda s: print(s, flush=True)).history
    accuracy[method] = loop.evaluate_checkpoint(cfg, echo=lambda s: print(s, flush=True))
    heldout_curves[method] = curves.read_curve(cfg.workdir)

  print("\nper step: " + ", ".join(COLUMNS))
  for step in range(min(len(h) for h in histories.values())):
    cells = []
    for method in METHODS:
      m = histories[method][step]
      cells.append(f"{method} " + "/".join(f"{m[c]:.0f}" for c in COLUMNS))
    print(f"step {step + 1}: " + " | ".join(cells))
  totals = {method: {c: sum(m[c] for m in histories[method]) for c in COLUMNS} for method in METHODS}
  print("\ntotals and ratios leap / other")
  for method in METHODS:
    line = ", ".join(f"{c}={totals[method][c]:.0f}" for c in COLUMNS)
    if method != "leap":
      line += "; ratio " + ", ".join(f"{c}={totals['leap'][c] / max(totals[method][c], 1e-9):.2f}" for c in COLUMNS)
    print(f"{method}: {line}")
  turns = base.heldout.num_turns
  print("\nheld-out: " + " | ".join(f"{method} Acc@1={accuracy[method]['Acc@1']:.3f} "
                                     f"Acc@{turns}={accuracy[method][f'Acc@{turns}']:.3f}" for method in METHODS))
  print_equal_accuracy(heldout_curves)


def print_equal_accuracy(heldout_curves: dict) -> None:
  """The cost (seconds / generated tokens / evaluator calls) at which each method first reached each held-out
  Acc@1 level, and the time to equal Acc@1."""
  print("\ncost to first reach held-out Acc@1 (seconds / tokens / evaluator calls; - never)")
  for row in curves.equal_accuracy_table(heldout_curves):
    cells = [f"{m} " + ("-" if row[m] is None else "/".join(f"{row[m][k]:.0f}" for k in curves.COSTS))
             for m in heldout_curves]
    print(f"Acc@1 >= {row['level']:.3f}: " + " | ".join(cells))
  equal = curves.time_to_equal_accuracy(heldout_curves, "leap")
  if equal is None:
    print("time to equal Acc@1: no method improved on the starting Acc@1")
    return
  print(f"time to equal Acc@1 = {equal['level']:.3f}: " + ", ".join(
      f"{m} / leap = {r['cumulative/seconds']:.2f}x time, {r['cumulative/generated_tokens']:.2f}x tokens, "
      f"{r['cumulative/evaluator_calls']:.2f}x evaluator calls" for m, r in equal["ratio"].items() if m != "leap"))


if __name__ == "__main__":
  main(sys.argv)
