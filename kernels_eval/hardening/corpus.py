"""The hardening corpus: every adversarial case of every language, and how to judge its verdict.

`all_cases()` joins `cuda_cases.CASES` and the Pallas table `pallas_cases.CASES` (whose records give
the expected EvalResult stage; they run on CPU in interpret mode, so none needs a GPU).
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
from kernels_eval.hardening import pallas_cases
from kernels_eval.hardening.cases import Case

def _from_pallas(c: pallas_cases.Case, task_id: str) -> Case:
  return Case(name=f"pallas_{c.name}", lang="pallas", task_id=task_id, attack=c.name.replace("_", " "),
              stage=c.stage, status=c.status, reason=c.rejected_reason, flag=c.flag,
              source=c.source, result_stage=c.stage, task_source=pallas_cases.TASK_SOURCE, timeout_s=c.timeout_s)


def all_cases() -> list[Case]:
  pallas_task = task_lib.parse_task_source(pallas_cases.TASK_SOURCE, "hardening/pallas_cases", trusted=True)
  cases = list(cuda_cases.CASES) + [_from_pallas(c, pallas_task.id) for c in pallas_cases.CASES]
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
  return ok, f"expected {expected_text(case)}, got {got}"


def table(cases: Iterable[Case]) -> str:
  rows = ["| case | lang | attack | caught at | expected |", "|---|---|---|---|---|"]
  rows += [f"| {c.name} | {c.lang} | {c.attack} | {c.stage}{' (GPU)' if c.needs_gpu else ''} | "
           f"{expected_text(c)} |" for c in cases]
  return "\n".join(rows)
