"""The hardening corpus: every adversarial case of every language, and how to judge its verdict.

`all_cases()` joins `cuda_cases.CASES`, the Pallas tables (`pallas_cases.CASES`, `pallas_static_cases.CASES`
and the 0-d output cases `pallas_cases.SCALAR_CASES`, whose records give the expected EvalResult stage; they
run on CPU in interpret mode, so none needs a GPU) and `escaped.CASES` (candidates that already escaped the
Python checks: the kernel's isolation and the verdict protocol; run only where `escaped.register()` was called).
`judge(case, result, gpu, sanitizer)` says whether an EvalResult is what the case demands:
  - when the catching stage can run here: the expected status, rejected_reason, flag (and stage);
  - a case that needs a GPU, on a CPU host: it must pass the static checks, compilation and the audit
    and end `not_run` at stage `compile` with no rejected_reason (never `correct`, never stopped early);
  - a "sanitizer" case on a GPU run without compute-sanitizer must only reach the run: a write just
    past the end of a buffer often goes unnoticed there, which is why it has its own stage.
`table(cases)` renders the table: case, language, attack, catching stage, expected verdict.
"""
from __future__ import annotations

from typing import Iterable

from kernels_eval import schema
from kernels_eval import task as task_lib
from kernels_eval.hardening import cuda_cases
from kernels_eval.hardening import escaped
from kernels_eval.hardening import pallas_cases
from kernels_eval.hardening import pallas_static_cases
from kernels_eval.hardening.cases import Case

CLASSES = (
    ("Pallas: Python-level checks (allowlists, fail closed)", lambda c: c.lang == "pallas" and c.stage == "static"),
    ("Pallas: what runs is what was checked (jaxpr, lowering, trials)",
     lambda c: c.lang == "pallas" and c.stage != "static"),
    ("CUDA: source rules on the preprocessed text", lambda c: c.lang == "cuda" and c.stage == "static"),
    ("CUDA: compilation and the library audit", lambda c: c.lang == "cuda" and c.stage in ("compile", "audit")),
    ("CUDA: the GPU run", lambda c: c.lang == "cuda" and c.stage not in ("static", "compile", "audit")),
    ("Kernel isolation (escaped candidates)", lambda c: c.lang == escaped.LANG and c in escaped.ISOLATION),
    ("Verdict channel and pool (escaped candidates)", lambda c: c.lang == escaped.LANG and c not in escaped.ISOLATION),
)

def _from_pallas(c: pallas_cases.Case, task_source: str = pallas_cases.TASK_SOURCE) -> Case:
  task_id = task_lib.parse_task_source(task_source, "hardening/pallas_cases", trusted=True).id
  return Case(name=f"pallas_{c.name}", lang="pallas", task_id=task_id, attack=c.name.replace("_", " "),
              stage=c.stage, status=c.status, reason=c.rejected_reason, flag=c.flag,
              source=c.source,  # a correct case ends at correctness on a CPU, at timing on a GPU
              result_stage=None if c.status == "correct" else c.stage,
              task_source=task_source, timeout_s=c.timeout_s)


def all_cases() -> list[Case]:
  pallas = [_from_pallas(c) for c in pallas_cases.CASES + pallas_static_cases.CASES]
  pallas += [_from_pallas(c, pallas_cases.SCALAR_TASK_SOURCE) for c in pallas_cases.SCALAR_CASES]
  cases = list(cuda_cases.CASES) + pallas + list(escaped.CASES)
  names = [c.name for c in cases]
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise ValueError(f"hardening cases with the same name: {duplicates}")
  return cases


def case_task(case: Case, embedded: dict[str, task_lib.Task]) -> task_lib.Task:
  """The task a case targets: its own `task_source`, else the embedded task `task_id`."""
  if case.task_source is not None:
    return task_lib.parse_task_source(case.task_source, f"{case.task_id}.py", trusted=True)
  if case.task_id not in embedded:
    raise ValueError(f"hardening case {case.name}: no embedded task {case.task_id!r}")
  return embedded[case.task_id]


def expected_text(case: Case) -> str:
  parts = [case.status] + [p for p in (case.reason, case.flag and f"flag {case.flag}") if p]
  return " / ".join(parts)


def judge(case: Case, result: schema.EvalResult, gpu: bool, sanitizer: bool = False) -> tuple[bool, str]:
  """(ok, explanation) for one case's EvalResult."""
  got = f"{result.status} at {result.stage}, reason {result.rejected_reason}, flags {result.flags}"
  if result.infra_error:
    return False, f"infrastructure error: {result.infra_error}"
  if case.needs_gpu and not gpu:
    ok = result.status == "not_run" and result.stage == "compile" and result.rejected_reason is None
    return ok, (f"passed static, compile and audit, then {got}" if ok else f"stopped before the GPU: {got}")
  if case.stage == "sanitizer" and not sanitizer:
    ok = result.rejected_reason is None and result.status != "compile_error"
    return ok, f"ran on the GPU without compute-sanitizer: {got}"
  ok = result.status == case.status
  ok = ok and (case.reason is None or result.rejected_reason == case.reason)
  ok = ok and (case.flag is None or case.flag in result.flags)
  ok = ok and (case.result_stage is None or result.stage == case.result_stage)
  ok = ok and (case.feedback_has is None or case.feedback_has in result.feedback)
  return ok, f"expected {expected_text(case)}, got {got}"


def table(cases: Iterable[Case], got: dict[str, str] | None = None) -> str:
  """A markdown table per attack class (`CLASSES`): case, attack, catching stage, expected verdict and,
  with `got` (case name -> text), the verdict a run gave."""
  cases = list(cases)
  out = []
  for title, member in CLASSES:
    group = [c for c in cases if member(c)]
    if not group:
      continue
    head = "| case | attack | caught at | expected |" + (" got |" if got else "")
    out += [f"**{title}** ({len(group)})", "", head, "|---|---|---|---|" + ("---|" if got else "")]
    out += [f"| {c.name} | {c.attack} | {c.stage}{' (GPU)' if c.needs_gpu else ''} | {expected_text(c)} |"
            + (f" {got.get(c.name, '')} |" if got else "") for c in group]
    out.append("")
  return "\n".join(out)
