"""The hardening corpus (CUDA and Pallas): every case is caught at its stage, with the expected verdict.

On a CPU host the static, compile, lower and audit stages run for real; CUDA cases that need a GPU must
pass all of them and end `not_run` (they run for real on a GPU host, and in `launch/gpu_check.py`).
The Pallas cases caught while running trials (interpret mode, CPU) are run against the same table by
`test_kernels_eval_pool.py`; here they are only part of the table.
"""
import pathlib

import pytest

from kernels_eval import evaluator as evaluator_lib
from kernels_eval import task as task_lib
from kernels_eval.cuda import backend
from kernels_eval.hardening import corpus

ATTACKS = ("infinite loop", "segfault", "illegal address", "out-of-bounds", "huge", "fork bomb", "file write",
           "network", "system()", "thread", "stream", "zeros output", "output buffer never written",
           "input overwrite", "decoy", "library call", "result caching", "timer")
SENTINELS = ("/tmp/pwned", "pwned", "sentinel.txt")


@pytest.fixture(scope="module")
def verdicts():
  embedded = {t.id: t for t in task_lib.load_tasks()}
  cases = [c for c in corpus.all_cases() if c.lang == "cuda" or c.stage not in ("correctness", "timing")]
  tasks = [corpus.case_task(c, embedded) for c in cases]
  cuda = [(t, c.source) for t, c in zip(tasks, cases) if c.lang == "cuda"]
  backend.build_many([t for t, _ in cuda], [s for _, s in cuda])
  results = {}
  for timeout in sorted({c.timeout_s for c in cases}, key=lambda x: x or 0):
    group = [(c, t) for c, t in zip(cases, tasks) if c.timeout_s == timeout]
    with evaluator_lib.Evaluator(workers=2, timeout_s=timeout) as ev:
      got = ev.evaluate_many([evaluator_lib.EvalRequest(t, c.source, c.lang, request_id=c.name) for c, t in group])
      control = embedded["add"]
      alive = ev.evaluate(evaluator_lib.EvalRequest(control, control.solutions["pallas"], "pallas", "correctness"))
      gpu = ev.pool.platform != "cpu"
    results.update({c.name: r for (c, _), r in zip(group, got)})
  return cases, results, gpu, alive


def test_corpus_covers_the_attacks_with_at_least_30_cases():
  cases = corpus.all_cases()
  assert len(cases) >= 30
  assert {c.lang for c in cases} == {"cuda", "pallas"}
  text = " ".join(c.attack.lower() for c in cases)
  missing = [a for a in ATTACKS if a not in text]
  assert not missing, missing
  table = corpus.table(cases)
  assert table.count("\n") == len(cases) + 1 and "| cuda_system_call | cuda | system() | static |" in table


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
