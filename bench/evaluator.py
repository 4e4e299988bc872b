"""Evaluator throughput: evaluations per second and per-stage time, cold workers vs a warm pool.

Cold: a fresh evaluator (one worker, JAX imported anew) per evaluation. Warm: one pool with started
workers evaluating a batch concurrently. Candidates are the embedded suite's Pallas solutions (stages
"correctness", interpret mode on CPU); the verdict cache is off, and so is the persistent compilation
cache unless --compile-cache is given. Run as `python bench/evaluator.py [--n N] [--workers W]`.
"""
import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import kernels_eval as ke  # noqa: E402

STAGES = ("static", "reference", "compile", "lower", "correctness")


def _requests(tasks, n, tag):
  return [ke.EvalRequest(t, t.solutions["pallas"], "pallas", "correctness", f"{tag}-{i}")
          for i, t in zip(range(n), tasks * (n // len(tasks) + 1))]


def _stage_table(results):
  rows = []
  for stage in STAGES + ("worker_start", "total"):
    vals = [r.provenance.durations[stage] for r in results if stage in r.provenance.durations]
    if vals:
      rows.append(f"  {stage:<12} median {statistics.median(vals):7.3f} s   (n={len(vals)})")
  return "\n".join(rows)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--n", type=int, default=12, help="warm-pool evaluations")
  parser.add_argument("--cold", type=int, default=3, help="cold-worker evaluations")
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--compile-cache", action="store_true", help="give the workers a persistent compile cache")
  args = parser.parse_args()
  tasks = [t for t in ke.load_tasks() if "pallas" in t.solutions]
  if not tasks:
    raise SystemExit("the embedded suite has no Pallas solutions to evaluate")
  cache = tempfile.mkdtemp(prefix="bench_jax_cache-") if args.compile_cache else None
  print(f"tasks: {len(tasks)}; load average before: {os.getloadavg()[0]:.1f}; cpus: {os.cpu_count()}")

  cold = []
  start = time.perf_counter()
  for req in _requests(tasks, args.cold, "cold"):
    with ke.Evaluator(workers=1, cache_size=0, compile_cache_dir=cache) as ev:
      cold.append(ev.evaluate(req))
  cold_s = time.perf_counter() - start
  print(f"cold workers: {args.cold} evaluations in {cold_s:.1f} s = {args.cold / cold_s:.3f} eval/s")
  print(_stage_table(cold))

  with ke.Evaluator(workers=args.workers, cache_size=0, compile_cache_dir=cache) as ev:
    t0 = time.perf_counter()
    ev.pool.warm_up()
    startup = time.perf_counter() - t0
    start = time.perf_counter()
    warm = ev.evaluate_many(_requests(tasks, args.n, "warm"))
    warm_s = time.perf_counter() - start
  print(f"warm pool ({args.workers} workers, started in {startup:.1f} s): {args.n} evaluations in {warm_s:.1f} s "
        f"= {args.n / warm_s:.3f} eval/s ({warm_s / args.n:.2f} s per evaluation)")
  print(_stage_table(warm))
  statuses = sorted({r.status for r in cold + warm})
  print(f"statuses: {statuses}; speedup warm/cold: {(args.n / warm_s) / (args.cold / cold_s):.2f}x; "
        f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
  main()
