"""The project's GPU check: evaluator, sampler and learner sections, results as JSON.

  python launch/gpu_check.py --out DIR [--sections evaluator,sampler,learner] [--budget-s 470]

evaluator  every embedded task's trusted CUDA and Pallas solution evaluated for real (status, speedup,
           kernel and reference time), the CUDA suite compiled in one parallel batch (cold vs cached),
           and the hardening corpus judged case by case; the out-of-bounds cases run again under
           compute-sanitizer. Without a GPU: CUDA ends `not_run: no GPU` after compile and audit, the
           Pallas suite and the sanitizer runs are skipped (the CPU test suite covers them).
sampler    `leap_jax.sampling.gpu_section.run(out_dir)` (skipped when that module is missing).
learner    `leap_jax.train.gpu_section.run(out_dir)` (skipped when that module is missing).

Results go to DIR/gpu_check.json after every section. The whole run stays within `--budget-s`; a
section that would start after the budget is reported as skipped. Needs only jax, numpy and nvcc
(no ml_collections, orbax or ray on this path).
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
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

SECTIONS = ("evaluator", "sampler", "learner")
NO_GPU = "not_run: no GPU"


class Report:
  """The JSON document, rewritten after every change."""

  def __init__(self, out_dir: pathlib.Path, gpu: bool):
    self.path = out_dir / "gpu_check.json"
    self.data = {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(), "gpu": gpu, "sections": {}}

  def set(self, section: str, value: dict) -> None:
    self.data["sections"][section] = value
    tmp = self.path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True, default=str))
    os.replace(tmp, self.path)


def _fmt(x: float | None, spec: str = ".3g") -> str:
  return "-" if x is None else format(x, spec)


def _row(cells: list[str]) -> str:
  return "| " + " | ".join(cells) + " |"


def _result_row(name: str, lang: str, r) -> dict:
  t = r.timing
  return {"task": name, "lang": lang, "status": r.status, "stage": r.stage, "rejected_reason": r.rejected_reason,
          "speedup": t.speedup if t else None, "kernel_ms": t.kernel_ms if t else None,
          "reference_ms": t.reference_ms if t else None, "eval_s": r.provenance.durations.get("total"),
          "flags": r.flags, "infra_error": r.infra_error, "feedback": r.feedback[:300]}


def _print_results(rows: list[dict]) -> None:
  print(_row(["task", "lang", "status", "speedup", "kernel ms", "reference ms", "eval s"]))
  print(_row(["---"] * 7))
  for r in rows:
    print(_row([r["task"], r["lang"], r["status"], _fmt(r["speedup"]), _fmt(r["kernel_ms"], ".4g"),
                _fmt(r["reference_ms"], ".4g"), _fmt(r["eval_s"], ".1f")]))
    if r["status"] == "not_run":
      print(f"  {r['task']} [{r['lang']}]: {r['feedback'].splitlines()[0][:160]}")
    elif r["status"] != "correct" or r["infra_error"]:
      print(f"  {r['task']} [{r['lang']}] {r['infra_error'] or ''} {r['feedback'][:300]}")


def _evaluator(gpu: bool, workers: int, timeout_s: float | None = None) -> evaluator_lib.Evaluator:
  # Timing-size inputs and outputs (e.g. 4096 x 4096 float32) are written as files by the harness.
  limits = sandbox.Limits(file_bytes=1 << 30, address_space_limit=not gpu)
  return evaluator_lib.Evaluator(workers=workers, limits=limits, timeout_s=timeout_s)


def evaluator_section(report: Report, gpu: bool, deadline: float, workers: int) -> dict:
  out: dict = {}
  tc = toolchain.find_toolchain()
  out["toolchain"] = {**tc.describe(), "arch": toolchain.target_arch(), "gpu_arch": toolchain.visible_gpu_arch()}
  print(f"toolchain: {tc.origin} nvcc {tc.version} ({tc.nvcc}), arch {out['toolchain']['arch']}")
  tasks = task_lib.load_tasks()
  cuda_tasks = [t for t in tasks if "cuda" in t.solutions]
  pallas_tasks = [t for t in tasks if "pallas" in t.solutions]

  start = time.monotonic()
  builds = cuda_backend.build_many(cuda_tasks, [t.solutions["cuda"] for t in cuda_tasks])
  out["compile"] = {"kernels": len(builds), "wall_s": time.monotonic() - start,
                    "cache_hits": sum(b.cache_hit for b in builds),
                    "nvcc_s_per_kernel": statistics.mean([b.seconds for b in builds if not b.cache_hit] or [0.0]),
                    "failed": [t.id for t, b in zip(cuda_tasks, builds) if not b.ok]}
  print(f"compiled {len(builds)} CUDA solutions in {out['compile']['wall_s']:.1f} s "
        f"({out['compile']['cache_hits']} cache hits); failed: {out['compile']['failed'] or 'none'}")
  report.set("evaluator", out)

  requests = [evaluator_lib.EvalRequest(t, t.solutions["cuda"], "cuda", "full", request_id=f"check-{t.id}-cuda")
              for t in cuda_tasks]
  if gpu:
    requests += [evaluator_lib.EvalRequest(t, t.solutions["pallas"], "pallas", "full",
                                           request_id=f"check-{t.id}-pallas") for t in pallas_tasks]
  else:
    print(f"pallas suite: skipped ({NO_GPU}; interpret mode runs in the CPU test suite)")
    out["pallas_suite"] = {"skipped": NO_GPU}
  if time.monotonic() > deadline:
    out["suite"] = {"skipped": "time budget"}
    return out
  with _evaluator(gpu, workers) as ev:
    results = ev.evaluate_many(requests)
  rows = [_result_row(rq.task.id, rq.lang, r) for rq, r in zip(requests, results)]
  _print_results(rows)
  out["suite"] = rows
  out["suite_summary"] = {}
  for r in rows:
    counts = out["suite_summary"].setdefault(r["lang"], {})
    counts[r["status"]] = counts.get(r["status"], 0) + 1
  print(f"suite: {out['suite_summary']}")
  report.set("evaluator", out)

  if time.monotonic() > deadline:
    out["hardening"] = {"skipped": "time budget"}
    return out
  out["hardening"] = hardening(gpu, workers, sanitizer=False)
  report.set("evaluator", out)
  if gpu and time.monotonic() < deadline:
    if cuda_session.sanitizer_path(tc.root) is None:
      out["hardening_sanitizer"] = {"skipped": "compute-sanitizer not found"}
    else:
      os.environ[gpu_job.SANITIZER_ENV] = "1"
      try:
        out["hardening_sanitizer"] = hardening(gpu, workers, sanitizer=True)
      finally:
        del os.environ[gpu_job.SANITIZER_ENV]
  elif not gpu:
    print(f"hardening under compute-sanitizer: skipped ({NO_GPU})")
    out["hardening_sanitizer"] = {"skipped": NO_GPU}
  return out


def hardening(gpu: bool, workers: int, sanitizer: bool) -> dict:
  embedded = {t.id: t for t in task_lib.load_tasks()}
  cases = corpus.all_cases()
  if sanitizer:
    cases = [c for c in cases if c.stage == "sanitizer"]
  title = "hardening corpus" + (" under compute-sanitizer" if sanitizer else "")
  rows, judged = [], 0
  for timeout in sorted({c.timeout_s for c in cases}, key=lambda x: x or 0):
    group = [c for c in cases if c.timeout_s == timeout]
    with _evaluator(gpu, workers, timeout) as ev:
      results = ev.evaluate_many([evaluator_lib.EvalRequest(corpus.case_task(c, embedded), c.source, c.lang,
                                                            request_id=c.name) for c in group])
    for c, r in zip(group, results):
      ok, why = corpus.judge(c, r, gpu=gpu, sanitizer=sanitizer)
      judged += ok
      rows.append({"case": c.name, "lang": c.lang, "stage": c.stage, "needs_gpu": c.needs_gpu,
                   "expected": corpus.expected_text(c), "ok": ok, "why": why, "status": r.status,
                   "eval_s": r.provenance.durations.get("total")})
  print(f"{title}: {judged} of {len(rows)} cases caught as expected")
  print(_row(["case", "caught at", "expected", "got", "ok", "eval s"]))
  print(_row(["---"] * 6))
  for r in rows:
    print(_row([r["case"], r["stage"] + (" (GPU)" if r["needs_gpu"] else ""), r["expected"], r["status"],
                "yes" if r["ok"] else "NO", _fmt(r["eval_s"], ".1f")]))
    if r["needs_gpu"] and not gpu:
      print(f"  {r['case']}: {NO_GPU} (passed static checks, compile and audit)")
    if not r["ok"]:
      print(f"  {r['case']}: {r['why']}")
  return {"cases": rows, "caught": judged, "total": len(rows)}


def external_section(name: str, module: str, out_dir: pathlib.Path) -> dict:
  try:
    mod = importlib.import_module(module)
  except ModuleNotFoundError as e:
    if e.name and module.startswith(e.name):
      print(f"{name}: skipped ({module} is missing)")
      return {"skipped": f"{module} is missing"}
    raise
  result = mod.run(str(out_dir))
  print(f"{name}: {json.dumps(result, default=str)[:2000]}")
  return result if isinstance(result, dict) else {"result": result}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="folder for gpu_check.json (created)")
  parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
  parser.add_argument("--budget-s", type=float, default=470.0, help="stop starting sections after this")
  parser.add_argument("--workers", type=int, default=0, help="evaluator workers (0: 4 on a GPU host, else 2)")
  args = parser.parse_args(argv)
  sections = [s.strip() for s in args.sections.split(",") if s.strip()]
  unknown = sorted(set(sections) - set(SECTIONS))
  if unknown:
    parser.error(f"unknown sections {unknown}; known: {SECTIONS}")
  out_dir = pathlib.Path(args.out)
  out_dir.mkdir(parents=True, exist_ok=True)
  start = time.monotonic()
  deadline = start + args.budget_s
  gpu = pool_lib.has_gpu()
  workers = args.workers or (4 if gpu else 2)
  os.environ.setdefault("KERNELS_EVAL_CUDA_CHECK_TIMEOUT_S", "20")
  report = Report(out_dir, gpu)
  print(f"gpu_check: GPU {'present' if gpu else 'absent'}; sections {sections}; results in {report.path}")
  if not gpu:
    print(f"{NO_GPU}: CUDA candidates stop after compile and audit; GPU timings are not measured")
  failed = False
  for name in sections:
    if time.monotonic() > deadline:
      print(f"{name}: skipped (time budget of {args.budget_s:.0f} s used)")
      report.set(name, {"skipped": "time budget"})
      continue
    t0 = time.monotonic()
    print(f"\n== {name} ==")
    try:
      if name == "evaluator":
        value = evaluator_section(report, gpu, deadline, workers)
      elif name == "sampler":
        value = external_section(name, "leap_jax.sampling.gpu_section", out_dir)
      else:
        value = external_section(name, "leap_jax.train.gpu_section", out_dir)
    except Exception:  # noqa: BLE001  (report the section's failure and go on with the next)
      failed = True
      value = {"error": traceback.format_exc()[-4000:]}
      print(value["error"])
    value["section_s"] = time.monotonic() - t0
    report.set(name, value)
  print(f"\ngpu_check finished in {time.monotonic() - start:.0f} s; wrote {report.path}")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
