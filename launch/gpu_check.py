"""The project's GPU check: evaluator, sampler and learner sections, results as JSON.

  python launch/gpu_check.py --out DIR [--sections evaluator,sampler,learner] [--budget-s 450] [--dry-run]

evaluator  the CUDA suite compiled in one parallel batch, cold then cached; jobs/s of the same few jobs at 1
           and at N workers and the spread between the two timings of each kernel; every embedded task's
           trusted CUDA and Pallas solution evaluated for real (status, kernel and reference device time,
           speedup, achieved bandwidth, where a job's time goes); the hardening corpus case by case, and its
           out-of-bounds cases again under compute-sanitizer. Without a GPU, CUDA ends `not_run: no GPU`
           after compile and audit and the sanitizer runs are skipped.
sampler    `leap_jax.sampling.gpu_section.run`: tokens/s, compile times, bandwidth against the device's copy.
learner    `leap_jax.train.gpu_section.run`: compile time, step time, tokens/s, model FLOPs utilisation, per
           episode and shared-prefix.
kernelbench the KernelBench fixture problems (tests/fixtures/kernelbench) loaded as KernelBench tasks and
           their right Pallas answers, then their ModelNew CUDA answers ("cuda"), evaluated: on a GPU at the
           files' own sizes against the torch reference, timed where torch sees the GPU; per problem status,
           speedup and flags, and fast_p over them. On a CPU the same path runs at the check sizes (statuses,
           no times; the CUDA answers compile and end not_run).

Every section gets a deadline (its share of what is left of `--budget-s`) and checks it before each batch;
a batch still running at its deadline is abandoned (its unfinished jobs are reported as such). DIR/gpu_check.json
is rewritten after every batch, so a killed run still leaves what it measured. `--dry-run` runs every
section's code path on a few tasks and tiny shapes on whatever machine this is (on a CPU the evaluator times
at the check sizes, so the timing path runs too; its numbers mean nothing). The check needs JAX, NumPy,
Flax, Optax, nvcc and (for the kernelbench section) torch; no ml_collections, orbax, ray or transformers.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import math
import os
import pathlib
import statistics
import sys
import time
import traceback

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
  sys.path.insert(0, str(REPO_ROOT))

from kernels_eval import evaluator as evaluator_lib  # noqa: E402  (after the path setup above)
from kernels_eval import pool as pool_lib  # noqa: E402
from kernels_eval import sandbox  # noqa: E402
from kernels_eval import task as task_lib  # noqa: E402
from kernels_eval.cuda import backend as cuda_backend  # noqa: E402
from kernels_eval.cuda import gpu_job  # noqa: E402
from kernels_eval.cuda import session as cuda_session  # noqa: E402
from kernels_eval.cuda import toolchain  # noqa: E402
from kernels_eval.hardening import corpus  # noqa: E402
from kernels_eval.hardening import escaped  # noqa: E402
from kernels_eval.kernelbench import metrics as kernelbench_metrics  # noqa: E402
from kernels_eval.kernelbench import tasks as kernelbench_tasks  # noqa: E402

SECTIONS = ("evaluator", "kernelbench", "sampler", "learner")
SHARES = {"evaluator": 0.50, "kernelbench": 0.05, "sampler": 0.15, "learner": 0.30}
KERNELBENCH_FIXTURES = REPO_ROOT / "tests" / "fixtures" / "kernelbench"
NO_GPU = "not_run: no GPU"
SCALING_TASKS = 2          # per language: the same jobs at 1 and at N workers
DRY_RUN_TASKS = 2          # per language, in a dry run
DRY_RUN_CASE_STRIDE = 12   # every 12th hardening case, in a dry run


class Report:
  """The JSON document, rewritten after every change."""

  def __init__(self, out_dir: pathlib.Path, gpu: bool, dry_run: bool):
    self.path = out_dir / "gpu_check.json"
    self.data = {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(), "gpu": gpu,
                 "dry_run": dry_run, "sections": {}}

  def set(self, section: str, value: dict) -> None:
    self.data["sections"][section] = value
    tmp = self.path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True, default=str))
    os.replace(tmp, self.path)


def _fmt(x: float | None, spec: str = ".3g") -> str:
  return "-" if x is None else format(x, spec)


def _row(cells: list) -> str:
  return "| " + " | ".join(str(c) for c in cells) + " |"


def _print_table(head: list[str], rows: list[list]) -> None:
  print(_row(head))
  print(_row(["---"] * len(head)))
  for r in rows:
    print(_row(r))


class EvalRun:
  """What every evaluator batch shares: GPU or not, workers, deadline, dry run."""

  def __init__(self, gpu: bool, workers: int, deadline: float, dry_run: bool):
    self.gpu, self.workers, self.deadline, self.dry_run = gpu, workers, deadline, dry_run

  def left(self) -> float:
    return self.deadline - time.monotonic()

  def evaluator(self, workers: int, timeout_s: float | None = None) -> evaluator_lib.Evaluator:
    # Timing-size inputs and outputs (e.g. 4096 x 4096 float32) are written as files by the harness.
    limits = sandbox.Limits(file_bytes=1 << 30, address_space_limit=not self.gpu)
    return evaluator_lib.Evaluator(workers=workers, limits=limits, timeout_s=timeout_s,
                                   time_on_cpu=self.dry_run and not self.gpu)

  def batch(self, requests: list, workers: int, timeout_s: float | None = None) -> tuple[list, float]:
    """Results (None for a job unfinished at the deadline) and the batch's wall seconds."""
    start = time.monotonic()
    with self.evaluator(workers, timeout_s) as ev:
      futures = [ev.submit(r) for r in requests]
      concurrent.futures.wait(futures, timeout=max(self.left(), 0.0))
      results = [f.result() if f.done() else None for f in futures]
    return results, time.monotonic() - start


def _request(task, lang: str, tag: str) -> evaluator_lib.EvalRequest:
  return evaluator_lib.EvalRequest(task, task.solutions[lang], lang, "full", request_id=f"check-{tag}-{task.id}-{lang}")


def _result_row(rq, r) -> dict:
  if r is None:
    return {"task": rq.task.id, "lang": rq.lang, "status": "unfinished (time budget)"}
  t = r.timing
  return {"task": rq.task.id, "lang": rq.lang, "status": r.status, "stage": r.stage,
          "rejected_reason": r.rejected_reason, "speedup": t.speedup if t else None,
          "kernel_ms": t.kernel_ms if t else None, "reference_ms": t.reference_ms if t else None,
          "durations": dict(r.provenance.durations), "flags": r.flags, "infra_error": r.infra_error,
          "feedback": r.feedback[:300]}


def compile_batch(tasks: list) -> dict:
  """The CUDA suite compiled in one parallel batch, then again from the cache."""
  out = {}
  for label in ("cold", "cached"):
    start = time.monotonic()
    builds = cuda_backend.build_many(tasks, [t.solutions["cuda"] for t in tasks])
    out[label] = {"kernels": len(builds), "wall_s": round(time.monotonic() - start, 2),
                  "cache_hits": sum(b.cache_hit for b in builds),
                  "nvcc_s_per_kernel": statistics.mean([b.seconds for b in builds if not b.cache_hit] or [0.0]),
                  "failed": [t.id for t, b in zip(tasks, builds) if not b.ok]}
    print(f"CUDA compile ({label}): {len(builds)} kernels in {out[label]['wall_s']} s, "
          f"{out[label]['cache_hits']} cache hits, failed: {out[label]['failed'] or 'none'}")
  return out


def scaling(run: EvalRun, requests: list) -> dict:
  """The same jobs at 1 and at N workers: jobs/s each, and each kernel's two device timings."""
  out: dict = {"jobs": len(requests)}
  timings = {}
  for workers in (1, run.workers):
    if run.left() <= 0:
      out[f"workers_{workers}"] = {"skipped": "time budget"}
      continue
    results, wall = run.batch(requests, workers)
    done = [r for r in results if r is not None]
    out[f"workers_{workers}"] = {"wall_s": round(wall, 2), "finished": len(done),
                                 "jobs_per_s": round(len(done) / wall, 3) if wall else None}
    for rq, r in zip(requests, results):
      if r is not None and r.timing is not None:
        timings.setdefault(f"{rq.task.id}/{rq.lang}", []).append(r.timing.kernel_ms)
  spread = {k: {"ms": v, "relative_spread": (max(v) - min(v)) / statistics.mean(v)} for k, v in timings.items()
            if len(v) == 2}
  out["timing_spread"] = spread
  if spread:
    out["median_relative_spread"] = statistics.median(s["relative_spread"] for s in spread.values())
  print(f"scaling: {json.dumps({k: v for k, v in out.items() if k != 'timing_spread'})}")
  for k, v in spread.items():
    print(f"  timed twice: {k}: {v['ms'][0]:.4g} ms, {v['ms'][1]:.4g} ms ({100 * v['relative_spread']:.1f}%)")
  return out


def where_time_goes(rows: list[dict]) -> dict:
  """Mean seconds per job of each duration the records carry (static, reference, compile, ..., total)."""
  sums: dict[str, list[float]] = {}
  for r in rows:
    for k, v in (r.get("durations") or {}).items():
      sums.setdefault(k, []).append(v)
  return {k: round(statistics.mean(v), 3) for k, v in sorted(sums.items())}


def suite(run: EvalRun, requests: list) -> dict:
  results, wall = run.batch(requests, run.workers)
  rows = [_result_row(rq, r) for rq, r in zip(requests, results)]
  summary: dict = {}
  for r in rows:
    counts = summary.setdefault(r["lang"], {})
    counts[r["status"]] = counts.get(r["status"], 0) + 1
  finished = sum(r is not None for r in results)
  out = {"rows": rows, "summary": summary, "wall_s": round(wall, 2), "workers": run.workers,
         "jobs_per_s": round(finished / wall, 3) if wall else None, "mean_s_per_job": where_time_goes(rows)}
  _print_table(["task", "lang", "status", "speedup", "kernel ms", "reference ms", "total s"],
               [[r["task"], r["lang"], r["status"], _fmt(r.get("speedup")), _fmt(r.get("kernel_ms"), ".4g"),
                 _fmt(r.get("reference_ms"), ".4g"), _fmt((r.get("durations") or {}).get("total"), ".1f")]
                for r in rows])
  for r in rows:
    if r["status"] not in ("correct", "not_run") or r.get("infra_error"):
      print(f"  {r['task']} [{r['lang']}] {r.get('infra_error') or ''} {r.get('feedback', '')[:300]}")
  print(f"suite: {summary}; {out['jobs_per_s']} jobs/s at {run.workers} workers; mean s per job: "
        f"{out['mean_s_per_job']}")
  return out


def bandwidth(rows: list[dict], tasks: dict, gpu: bool) -> list[dict]:
  """Achieved bandwidth of each timed kernel: the fewest bytes it must move (inputs read once, output written
  once, at the sizes it was timed at) over its device time. Imports JAX (after every pool is closed) only to
  trace the trusted reference's output shape."""
  import jax  # pylint: disable=import-outside-toplevel
  from kernels_eval import reference_runner  # pylint: disable=import-outside-toplevel
  out = []
  for r in rows:
    if not r.get("kernel_ms"):
      continue
    task = tasks[r["task"]]
    dims = task.timing_dims if gpu else task.check_dims[0]
    shapes = [jax.ShapeDtypeStruct(s.concrete_shape(dims), s.dtype) for s in task.inputs]
    result = jax.eval_shape(reference_runner.load_reference(task.to_job()), *shapes)
    moved = sum(math.prod(x.shape) * x.dtype.itemsize for x in [*shapes, result])
    out.append({"task": r["task"], "lang": r["lang"], "bytes": moved, "kernel_ms": r["kernel_ms"],
                "gb_per_s": round(moved / (r["kernel_ms"] * 1e-3) / 1e9, 1)})
  return out


def hardening(run: EvalRun, sanitizer: bool) -> dict:
  escaped.register()  # the corpus's isolation and protocol cases are candidates of this test-only language
  embedded = {t.id: t for t in task_lib.load_tasks()}
  cases = corpus.all_cases()
  if sanitizer:
    cases = [c for c in cases if c.stage == "sanitizer"]
  if run.dry_run:
    cases = cases[::DRY_RUN_CASE_STRIDE]
  rows = []
  for timeout in sorted({c.timeout_s for c in cases}, key=lambda x: x or 0):
    group = [c for c in cases if c.timeout_s == timeout]
    if run.left() <= 0:
      rows += [{"case": c.name, "ok": None, "status": "skipped (time budget)"} for c in group]
      continue
    requests = [evaluator_lib.EvalRequest(corpus.case_task(c, embedded), c.source, c.lang, request_id=c.name)
                for c in group]
    results, _ = run.batch(requests, run.workers, timeout)
    for c, r in zip(group, results):
      ok, why = corpus.judge(c, r, gpu=run.gpu, sanitizer=sanitizer) if r is not None else (None, "unfinished")
      rows.append({"case": c.name, "lang": c.lang, "stage": c.stage, "needs_gpu": c.needs_gpu,
                   "expected": corpus.expected_text(c), "ok": ok, "why": why,
                   "status": r.status if r is not None else "unfinished (time budget)",
                   "eval_s": r.provenance.durations.get("total") if r is not None else None})
  caught = sum(r["ok"] is True for r in rows)
  print(f"hardening corpus{' under compute-sanitizer' if sanitizer else ''}: {caught} of {len(rows)} caught "
        f"as expected")
  for r in rows:
    if r["ok"] is False:
      print(f"  NOT CAUGHT {r['case']}: {r['why']}")
  return {"cases": rows, "caught": caught, "total": len(rows)}


def evaluator_section(report: Report, run: EvalRun) -> dict:
  out: dict = {}
  tc = toolchain.find_toolchain()
  out["toolchain"] = {**tc.describe(), "arch": toolchain.target_arch(), "gpu_arch": toolchain.visible_gpu_arch()}
  print(f"toolchain: {tc.origin} nvcc {tc.version} ({tc.nvcc}), arch {out['toolchain']['arch']}")
  tasks = task_lib.load_tasks()
  by_id = {t.id: t for t in tasks}
  cuda_tasks = [t for t in tasks if "cuda" in t.solutions]
  pallas_tasks = [t for t in tasks if "pallas" in t.solutions]
  if run.dry_run:
    cuda_tasks, pallas_tasks = cuda_tasks[:DRY_RUN_TASKS], pallas_tasks[:DRY_RUN_TASKS]
  out["compile"] = compile_batch(cuda_tasks)
  report.set("evaluator", out)
  steps = [("scaling", lambda: scaling(run, [_request(t, "cuda", "scale") for t in cuda_tasks[:SCALING_TASKS]]
                                      + [_request(t, "pallas", "scale") for t in pallas_tasks[:SCALING_TASKS]])),
           ("suite", lambda: suite(run, [_request(t, "cuda", "suite") for t in cuda_tasks]
                                   + [_request(t, "pallas", "suite") for t in pallas_tasks])),
           ("hardening", lambda: hardening(run, sanitizer=False))]
  for name, step in steps:
    out[name] = step() if run.left() > 0 else {"skipped": "time budget"}
    report.set("evaluator", out)
  if "rows" in out["suite"]:
    out["bandwidth"] = bandwidth(out["suite"]["rows"], by_id, run.gpu)
    report.set("evaluator", out)
  out["hardening_sanitizer"] = sanitizer_run(run, tc)
  return out


def sanitizer_run(run: EvalRun, tc) -> dict:
  if not run.gpu:
    print(f"hardening under compute-sanitizer: skipped ({NO_GPU})")
    return {"skipped": NO_GPU}
  if cuda_session.sanitizer_path(tc.root) is None:
    return {"skipped": "compute-sanitizer not found"}
  if run.left() <= 0:
    return {"skipped": "time budget"}
  os.environ[gpu_job.SANITIZER_ENV] = "1"
  try:
    return hardening(run, sanitizer=True)
  finally:
    del os.environ[gpu_job.SANITIZER_ENV]


def external_section(name: str, module: str, out_dir: pathlib.Path, deadline: float, dry_run: bool) -> dict:
  import importlib  # pylint: disable=import-outside-toplevel
  result = importlib.import_module(module).run(str(out_dir), deadline=deadline, dry_run=dry_run)
  print(f"{name}: {json.dumps(result, default=str)[:3000]}")
  return result if isinstance(result, dict) else {"result": result}


def _bandwidth_table(report: Report) -> None:
  """Each timed kernel's achieved bandwidth, and its fraction of the copy bandwidth the sampler section
  measured on the same device (when it ran)."""
  copy = (report.data["sections"].get("sampler") or {}).get("copy_gb_per_s")
  rows = (report.data["sections"].get("evaluator") or {}).get("bandwidth")
  if not rows:
    return
  for r in rows:
    r["fraction_of_copy"] = round(r["gb_per_s"] / copy, 3) if copy else None
  print(f"\nachieved bandwidth of the timed kernels (device copy: {_fmt(copy)} GB/s)")
  _print_table(["task", "lang", "MB moved", "kernel ms", "GB/s", "of copy"],
               [[r["task"], r["lang"], f"{r['bytes'] / 1e6:.1f}", _fmt(r["kernel_ms"], ".4g"), r["gb_per_s"],
                 _fmt(r["fraction_of_copy"])] for r in rows])
  report.set("evaluator", report.data["sections"]["evaluator"])


def _section_deadline(sections: list[str], index: int, end: float) -> float:
  """This section's share of the time left, the shares of the sections after it kept for them."""
  now = time.monotonic()
  shares = [SHARES[s] for s in sections[index:]]
  return now + (end - now) * shares[0] / sum(shares)


def kernelbench_answer(pid: str, which: str) -> str:
  """The "right" or "wrong" Pallas answer to KernelBench fixture problem `pid` (answers/cases.json)."""
  answers = KERNELBENCH_FIXTURES / "answers"
  case = json.loads((answers / "cases.json").read_text())[pid]
  text = (answers / f"{case['stem']}.py").read_text()
  for key, value in case[which].items():
    text = text.replace(key, value)
  return text


def _kernelbench_rows(ev, run: EvalRun, requests: list) -> list[dict]:
  futures = [ev.submit(r) for r in requests]
  concurrent.futures.wait(futures, timeout=max(run.left(), 0.0))
  return [_result_row(rq, f.result() if f.done() else None) for rq, f in zip(requests, futures)]


def _kernelbench_summary(tasks: list, rows: list[dict]) -> dict:
  levels = {t.id: t.level for t in tasks}
  solved = {r["task"]: 1 if r["status"] == "correct" else None for r in rows}
  per_level = kernelbench_metrics.per_level(levels, solved, 1, {r["task"]: r.get("speedup") for r in rows})
  _print_table(["problem", "lang", "status", "speedup", "flags"],
               [[r["task"], r["lang"], r["status"], _fmt(r.get("speedup")), ",".join(r.get("flags", []))]
                for r in rows])
  return {"results": rows, "per_level": {str(k): v for k, v in per_level.items()}}


def kernelbench_section(run: EvalRun) -> dict:
  """The fixture problems' right Pallas answers, then their ModelNew CUDA answers, as KernelBench tasks (see the
  module docstring)."""
  answers = KERNELBENCH_FIXTURES / "answers"
  stems = {pid: case["stem"] for pid, case in json.loads((answers / "cases.json").read_text()).items()}
  with run.evaluator(run.workers) as ev:
    tasks, skipped = kernelbench_tasks.load_tasks(str(KERNELBENCH_FIXTURES), ev)
    pallas = _kernelbench_rows(ev, run, [evaluator_lib.EvalRequest(
        t, kernelbench_answer(t.id, "right"), "pallas", "full", request_id=f"check-kernelbench-{t.id}") for t in tasks])
    cuda = _kernelbench_rows(ev, run, [evaluator_lib.EvalRequest(
        t, (answers / f"{stems[t.id]}_cuda.py").read_text(), "cuda", "full", request_id=f"check-kernelbench-cuda-{t.id}")
        for t in tasks])
  return {"skipped": skipped, **_kernelbench_summary(tasks, pallas), "cuda": _kernelbench_summary(tasks, cuda)}


def run_section(name: str, report: Report, run: EvalRun, out_dir: pathlib.Path) -> dict:
  if name == "evaluator":
    return evaluator_section(report, run)
  if name == "kernelbench":
    return kernelbench_section(run)
  module = "leap_jax.sampling.gpu_section" if name == "sampler" else "leap_jax.train.gpu_section"
  return external_section(name, module, out_dir, run.deadline, run.dry_run)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="folder for gpu_check.json (created)")
  parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
  parser.add_argument("--budget-s", type=float, default=450.0, help="the whole run's time budget")
  parser.add_argument("--workers", type=int, default=0, help="evaluator workers (0: 8 on a GPU host, else 2)")
  parser.add_argument("--dry-run", action="store_true", help="every code path on a few tasks and tiny shapes")
  args = parser.parse_args(argv)
  sections = [s.strip() for s in args.sections.split(",") if s.strip()]
  unknown = sorted(set(sections) - set(SECTIONS))
  if unknown:
    parser.error(f"unknown sections {unknown}; known: {SECTIONS}")
  out_dir = pathlib.Path(args.out)
  out_dir.mkdir(parents=True, exist_ok=True)
  start = time.monotonic()
  end = start + args.budget_s
  gpu = pool_lib.has_gpu()
  workers = args.workers or (8 if gpu else 2)
  # The sampler and learner run in this process after the evaluator's pools are gone: JAX must not take
  # the device's memory up front while workers need it.
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  os.environ.setdefault("KERNELS_EVAL_CUDA_CHECK_TIMEOUT_S", "20")
  report = Report(out_dir, gpu, args.dry_run)
  print(f"gpu_check: GPU {'present' if gpu else 'absent'}; sections {sections}; budget {args.budget_s:.0f} s; "
        f"{'dry run; ' if args.dry_run else ''}results in {report.path}")
  if not gpu:
    print(f"{NO_GPU}: CUDA candidates stop after compile and audit; GPU timings are not measured")
  failed = False
  for i, name in enumerate(sections):
    run = EvalRun(gpu, workers, _section_deadline(sections, i, end), args.dry_run)
    if run.left() <= 0:
      print(f"{name}: skipped (time budget of {args.budget_s:.0f} s used)")
      report.set(name, {"skipped": "time budget"})
      continue
    t0 = time.monotonic()
    print(f"\n== {name} (deadline in {run.left():.0f} s) ==")
    try:
      value = run_section(name, report, run, out_dir)
    except Exception:  # noqa: BLE001  (report the section's failure and go on with the next)
      failed = True
      value = {"error": traceback.format_exc()[-4000:]}
      print(value["error"])
    value["section_s"] = round(time.monotonic() - t0, 1)
    report.set(name, value)
  _bandwidth_table(report)
  print(f"\ngpu_check finished in {time.monotonic() - start:.0f} s; wrote {report.path}")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
