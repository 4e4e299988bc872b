"""The hardening corpus on this machine: every case, its expected verdict and the verdict it got.

Writes docs/hardening.md (one table per attack class: case, attack, catching stage, expected, got) and
prints how many cases were judged as expected. Cases whose catching stage needs a GPU count on a CPU host
when they pass every earlier stage and end `not_run` (`corpus.judge`). Run as
`python bench/hardening.py [--out docs/hardening.md] [--workers 2]`.
"""
import argparse
import datetime
import os
import pathlib
import platform
import sys

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from kernels_eval import backends  # noqa: E402
from kernels_eval import evaluator as evaluator_lib  # noqa: E402
from kernels_eval import task as task_lib  # noqa: E402
from kernels_eval.cuda import backend as cuda_backend  # noqa: E402
from kernels_eval.hardening import corpus  # noqa: E402
from kernels_eval.hardening import escaped  # noqa: E402


def run_all(workers: int) -> tuple[list, dict, bool]:
  embedded = {t.id: t for t in task_lib.load_tasks()}
  cases = corpus.all_cases()
  tasks = [corpus.case_task(c, embedded) for c in cases]
  cuda = [(t, c.source) for t, c in zip(tasks, cases) if c.lang == "cuda"]
  cuda_backend.build_many([t for t, _ in cuda], [s for _, s in cuda])
  escaped.register()
  os.environ.setdefault("KERNELS_EVAL_SECRET", os.urandom(32).hex())
  results = {}
  try:
    for timeout in sorted({c.timeout_s for c in cases}, key=lambda x: x or 0):
      group = [(c, t) for c, t in zip(cases, tasks) if c.timeout_s == timeout]
      with evaluator_lib.Evaluator(workers=workers, timeout_s=timeout, cache_size=0) as ev:
        got = ev.evaluate_many([evaluator_lib.EvalRequest(t, c.source, c.lang, request_id=c.name) for c, t in group])
        gpu = ev.pool.platform != "cpu"
      results.update({c.name: r for (c, _), r in zip(group, got)})
  finally:
    backends.unregister(escaped.LANG)
  return cases, results, gpu


def got_text(result) -> str:
  parts = [result.status, result.rejected_reason] + [f"flag {f}" for f in result.flags]
  text = " / ".join(p for p in parts if p) + f" at {result.stage}"
  return text + (f" (infra error: {result.infra_error[:60]})" if result.infra_error else "")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=str(REPO_ROOT / "docs" / "hardening.md"))
  parser.add_argument("--workers", type=int, default=2)
  args = parser.parse_args()
  cases, results, gpu = run_all(args.workers)
  verdicts = {c.name: corpus.judge(c, results[c.name], gpu=gpu) for c in cases}
  got = {name: ("ok: " if ok else "MISMATCH: ") + got_text(results[name]) for name, (ok, _) in verdicts.items()}
  passed = sum(ok for ok, _ in verdicts.values())
  header = (f"# Hardening corpus\n\n{datetime.date.today().isoformat()}, `python bench/hardening.py`, "
            f"{platform.machine()} {'GPU' if gpu else 'CPU'} host, {os.cpu_count()} cores: {passed} of {len(cases)} "
            "cases judged as expected. On a CPU host a case that needs the GPU counts when it passes every earlier "
            "stage and ends `not_run`.\n\n")
  pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  pathlib.Path(args.out).write_text(header + corpus.table(cases, got) + "\n")
  for name, (ok, why) in verdicts.items():
    if not ok:
      print(f"MISMATCH {name}: {why}")
  print(f"{passed} of {len(cases)} cases judged as expected; table in {args.out}")


if __name__ == "__main__":
  main()
