"""Turn-1 pass rate per task of the RL pool, to pick a pool of middling difficulty:

  python launch/pool_rates.py --config configs/default.py [--config.precheck.samples_per_task=8] [...]

Samples `precheck.samples_per_task` turn-1 answers per task of the pool (`tasks.*`) at the rollout temperature
from the latest RL checkpoint in the workdir (else the starting policy: the SFT checkpoint when `sft.enabled`),
prints each task's rate and the tasks with a rate in [0.2, 0.8], and writes `<workdir>/pool_rates.json`.
"""
import contextlib
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from launch import cli  # noqa: E402
from leap_jax.train import build  # noqa: E402
from leap_jax.train import checks  # noqa: E402
from leap_jax.train import loop  # noqa: E402

BAND = (0.2, 0.8)


def main(argv) -> dict:
  cfg = cli.train_config(argv)
  policy, step = loop.latest_policy(cfg)
  with contextlib.ExitStack() as stack:
    evaluator = stack.enter_context(build.make_evaluator(cfg.evaluator))
    tasks = build.pool_tasks(cfg.tasks)
    check = checks.turn1_pass_rate(build.Rollouts.of(cfg), policy, evaluator, tasks,
                                   cfg.precheck.samples_per_task)
  check["step"] = step
  for task, rate in sorted(check["per_task"].items(), key=lambda kv: kv[1]):
    print(f"{task:24s} {rate:.3f}")
  middling = tuple(t for t, r in check["per_task"].items() if BAND[0] <= r <= BAND[1])
  print(f"pool pass rate {check['pass_rate@1']:.3f} at step {step} ({cfg.precheck.samples_per_task} samples per "
        f"task, {check['seconds']:.0f} s); in [{BAND[0]}, {BAND[1]}]: {middling}", flush=True)
  workdir = pathlib.Path(cfg.workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "pool_rates.json").write_text(json.dumps({**check, "middling": list(middling)}, indent=2))
  return check


if __name__ == "__main__":
  main(sys.argv)
