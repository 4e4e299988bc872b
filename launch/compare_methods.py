"""Methods against each other over seeds, at a config's scale:

  python launch/compare_methods.py --config configs/learn_check.py [--methods leap,leap_no_dcp,grpo_mt,grpo]
      [--seeds 0,1,2] [--out workdirs/compare] [--reference leap] [--config.<field>=<value> ...]

Every run starts from one SFT policy (trained once into <out>/sft with the config's seed when `sft.enabled`) and
has the same tasks and step budget. Each (method, seed) is `launch/train.py` in its own process and workdir
<out>/<method>/seed<seed> (the seed sets the sampling keys and the learner's RNG; its log is train.log there).
A finished run is skipped and an interrupted one resumes from its checkpoints, so running the command again
after an interruption continues where it stopped. Then writes <out>/comparison.json, <out>/comparison.md
(`leap_jax.metrics.comparison`: means over seeds, cost to reach equal accuracy with bootstrap intervals) and
<out>/plots/{heldout,pool}_vs_cost.png.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from launch import cli  # noqa: E402
from leap_jax.metrics import comparison  # noqa: E402
from leap_jax.metrics import curves  # noqa: E402
from leap_jax.metrics import plots  # noqa: E402
from leap_jax.metrics.writer import METRICS_FILE, read_metrics  # noqa: E402
from leap_jax.rollout import methods as methods_lib  # noqa: E402
from leap_jax.train import build  # noqa: E402

LAUNCH = pathlib.Path(__file__).resolve().parent


def parse(argv):
  """(runner args, the config's command-line arguments, the typed config)."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--methods", default="leap,leap_no_dcp,grpo_mt,grpo")
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--out", default="workdirs/compare")
  parser.add_argument("--reference", default="leap", help="the method the cost ratios divide by")
  parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples of the seeds")
  args, config_args = parser.parse_known_args(argv[1:])
  args.methods = [m for m in args.methods.split(",") if m]
  args.seeds = [int(s) for s in args.seeds.split(",") if s]
  unknown = [m for m in args.methods if m not in methods_lib.METHODS]
  if unknown:
    raise SystemExit(f"error: unknown methods {unknown}; choose from {sorted(methods_lib.METHODS)}")
  if args.resamples < 1:
    raise SystemExit(f"error: --resamples must be >= 1, got {args.resamples}")
  if args.reference not in args.methods:
    raise SystemExit(f"error: --reference {args.reference!r} is not one of --methods {args.methods}")
  return args, config_args, cli.train_config([argv[0], *config_args])


def finished(workdir: pathlib.Path, cfg) -> bool:
  """The run did all its steps and wrote its end-of-run results."""
  if not (workdir / METRICS_FILE).exists():
    return False
  rows = read_metrics(workdir)
  ends = [("heldout.json", cfg.heldout.at_end), ("postcheck.json", cfg.precheck.enabled and cfg.precheck.after)]
  return bool(rows) and int(rows[-1]["step"]) + 1 >= cfg.steps and all(
      (workdir / name).exists() for name, wanted in ends if wanted)


def run_logged(label: str, command: list[str], log: pathlib.Path) -> None:
  """Runs `command`, its output appended to `log`; a failure stops the comparison naming the run and its log."""
  log.parent.mkdir(parents=True, exist_ok=True)
  with open(log, "a", encoding="utf-8") as f:
    code = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
  if code:
    raise SystemExit(f"error: {label} exited with {code}; see {log}")


def record(workdir: pathlib.Path) -> dict:
  """What the comparison reads of a finished run (`comparison.summarise`'s records)."""
  def read(name):
    path = workdir / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None
  precheck, postcheck = read("precheck"), read("postcheck")
  return {"heldout_curve": curves.read_curve(workdir), "metrics": read_metrics(workdir), "heldout": read("heldout"),
          "precheck": precheck and precheck["pass_rate@1"], "postcheck": postcheck and postcheck["pass_rate@1"]}


def run_all(args, config_args, cfg) -> dict[str, list[dict]]:
  """The shared SFT, then every (method, seed) not yet finished; returns each method's records by seed."""
  out = pathlib.Path(args.out)
  sft_dir = out / "sft"
  shared = [*config_args, f"--config.sft.checkpoint_dir={sft_dir}"]
  if cfg.sft.enabled and not build.has_checkpoint(sft_dir):
    print(f"SFT once for every run -> {sft_dir}", flush=True)
    run_logged("SFT", [sys.executable, str(LAUNCH / "sft.py"), *shared, f"--config.workdir={out}"],
               out / "sft.log")
  runs: dict[str, list[dict]] = {m: [] for m in args.methods}
  for seed in args.seeds:
    for method in args.methods:
      workdir, label = out / method / f"seed{seed}", f"{method} seed {seed}"
      if finished(workdir, cfg):
        print(f"{label}: finished, skipped", flush=True)
      else:
        started = time.perf_counter()
        run_logged(label, [sys.executable, str(LAUNCH / "train.py"), *shared, f"--config.method={method}",
                           f"--config.seed={seed}", f"--config.workdir={workdir}"], workdir / "train.log")
        if not finished(workdir, cfg):
          raise SystemExit(f"error: {label} stopped before its end (checkpointed; rerun to resume); see "
                           f"{workdir / 'train.log'}")
        print(f"{label}: done in {time.perf_counter() - started:.0f} s", flush=True)
      runs[method].append(record(workdir))
  return runs


def main(argv) -> int:
  args, config_args, cfg = parse(argv)
  runs = run_all(args, config_args, cfg)
  out = pathlib.Path(args.out)
  summary = comparison.summarise(runs, args.reference, args.resamples)
  (out / "comparison.json").write_text(json.dumps(comparison.finite_json(summary), indent=2))
  table = comparison.table_markdown(summary)
  (out / "comparison.md").write_text(table)
  (out / "plots").mkdir(exist_ok=True)
  plots.methods_against_cost({m: [r["heldout_curve"] for r in rs] for m, rs in runs.items()}, "Acc@1",
                             "held-out Acc@1 against training cost", str(out / "plots" / "heldout_vs_cost.png"))
  plots.methods_against_cost({m: [comparison.pool_curve(r["metrics"]) for r in rs] for m, rs in runs.items()},
                             comparison.POOL_KEY, "training turn-1 pass rate against training cost",
                             str(out / "plots" / "pool_vs_cost.png"))
  print(table, flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
