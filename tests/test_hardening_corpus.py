"""The hardening corpus (CUDA, Pallas, escaped candidates): every case is caught at its stage, as expected.

On a CPU host the static, compile, lower and audit stages run for real; CUDA cases that need a GPU must
pass all of them and end `not_run` (they run for real on a GPU host, and in `launch/gpu_check.py`).
The Pallas cases of `pallas_cases.CASES` caught while running trials (interpret mode, CPU) are run against
the same table by `test_kernels_eval_pool.py`; here they are only part of the table. The escaped cases
run with the evaluator's secret in the parent's environment, which none of them may find.
"""
import os
import pathlib

import pytest

from kernels_eval import backends
from kernels_eval import evaluator as evaluator_lib
from kernels_eval import task as task_lib
from kernels_eval.cuda import backend
from kernels_eval.hardening import corpus
from kernels_eval.hardening import escaped
from kernels_eval.hardening import pallas_cases

ATTACKS = ("infinite loop", "segfault", "illegal address", "out-of-bounds", "huge", "fork bomb", "file write",
           "network", "system()", "thread", "stream", "zeros output", "output buffer never written",
           "input overwrite", "decoy", "library call", "result caching", "timer", "match class pattern",
           "format", "decorator", "secret", "forged timing", "forged reference", "deep", "directory descriptor",
           "signal", "scalar output")
SENTINELS = ("/tmp/pwned", "pwned", "sentinel.txt")


@pytest.fixture(scope="module")
def verdicts():
  embedded = {t.id: t for t in task_lib.load_tasks()}
  cases = [c for c in corpus.all_cases() if c.lang != "pallas" or c.stage not in ("correctness", "timing")
           or c.task_source == pallas_cases.SCALAR_TASK_SOURCE]
  tasks = [corpus.case_task(c, embedded) for c in cases]
  cuda = [(t, c.source) for t, c in zip(tasks, cases) if c.lang == "cuda"]
  backend.build_many([t for t, _ in cuda], [s for _, s in cuda])
  results = {}
  escaped.register()
  os.environ["KERNELS_EVAL_SECRET"] = "ab" * 32
  try:
    yield _run(cases, tasks, embedded, results)
  finally:
    os.environ.pop("KERNELS_EVAL_SECRET")
    backends.unregister(escaped.LANG)


def _run(cases, tasks, embedded, results):
  for timeout in sorted({c.timeout_s for c in cases}, key=lambda x: x or 0):
    group = [(c, t) for c, t in zip(cases, tasks) if c.timeout_s == timeout]
    with evaluator_lib.Evaluator(workers=2, timeout_s=timeout) as ev:
      got = ev.evaluate_many([evaluator_lib.EvalRequest(t, c.source, c.lang, request_id=c.name) for c, t in group])
      control = embedded["add"]
      alive = ev.evaluate(evaluator_lib.EvalRequest(control, control.solutions["pallas"], "pallas", "correctness"))
      gpu = ev.pool.platform != "cpu"
    results.update({c.name: r for (c, _), r in zip(group, got)})
  return cases, results, gpu, alive


def test_corpus_covers_the_attacks_by_class():
  cases = corpus.all_cases()
  assert len(cases) >= 140 and len({c.name for c in cases}) == len(cases)
  assert {c.lang for c in cases} == {"cuda", "pallas", escaped.LANG}
  text = " ".join(c.attack.lower() for c in cases)
  missing = [a for a in ATTACKS if a not in text]
  assert not missing, missing
  table = corpus.table(cases)
  for title, member in corpus.CLASSES:
    assert sum(map(member, cases)) >= 5 and title in table, title
  assert table.count("\n| ") == len(cases) + len(corpus.CLASSES)
  assert "| cuda_system_call | system() | static | compile_error / host_syscall |" in table


def test_every_case_is_caught_at_its_stage(verdicts):
  cases, results, gpu, _ = verdicts
  failures = []
  for case in cases:
    ok, why = corpus.judge(case, results[case.name], gpu=gpu)
    if not ok:
      failures.append(f"{case.name}: {why}")
  assert not failures, "\n".join(failures)


def test_gpu_cases_pass_every_cpu_stage_first(verdicts):
  cases, results, gpu, _ = verdicts
  if gpu:
    pytest.skip("the GPU cases ran for real on this host")
  gpu_cases = [c for c in cases if c.needs_gpu]
  assert len(gpu_cases) >= 10
  for case in gpu_cases:
    result = results[case.name]
    assert (result.status, result.stage, result.rejected_reason) == ("not_run", "compile", None), case.name
    assert "not_run: no GPU" in result.feedback


def test_nothing_outside_the_sandbox_changed_and_the_pool_survived(verdicts):
  _, _, _, alive = verdicts
  assert alive.status == "correct", alive.feedback
  for path in SENTINELS:
    assert not pathlib.Path(path).exists(), path


def test_docs_table_lists_every_case_with_its_expected_verdict():
  """docs/hardening.md (written by `python bench/hardening.py`) is the corpus as it is now."""
  text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "hardening.md").read_text()
  rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
  for case in corpus.all_cases():
    assert case.name in rows, f"{case.name} is missing: rerun bench/hardening.py"
    assert f"| {corpus.expected_text(case)} |" in rows[case.name], case.name
  assert len([r for r in rows if r != "case"]) == len(corpus.all_cases())
