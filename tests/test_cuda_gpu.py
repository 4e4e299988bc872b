"""CUDA candidates on a GPU: trusted solutions come out correct and timed (skipped without a GPU)."""
import pytest

from kernels_eval import evaluator as evaluator_lib
from kernels_eval import sandbox
from kernels_eval import task as task_lib

TASKS = ("add", "silu_fp16", "softmax_row", "matmul")


@pytest.mark.gpu
def test_trusted_cuda_solutions_are_correct_and_timed():
  embedded = {t.id: t for t in task_lib.load_tasks()}
  requests = [evaluator_lib.EvalRequest(embedded[i], embedded[i].solutions["cuda"], "cuda", "full") for i in TASKS]
  limits = sandbox.Limits(file_bytes=1 << 30, address_space_limit=False)
  with evaluator_lib.Evaluator(workers=2, limits=limits) as ev:
    results = ev.evaluate_many(requests)
  for task_id, r in zip(TASKS, results):
    assert r.status == "correct", f"{task_id}: {r.feedback}"
    assert r.trials_passed == r.trials_total == 5
    assert r.timing is not None and r.timing.kernel_ms > 0 and r.timing.reference_ms > 0


@pytest.mark.gpu
def test_wrong_cuda_output_is_reported_with_mismatches():
  task = {t.id: t for t in task_lib.load_tasks()}["add"]
  wrong = task.solutions["cuda"].replace("x[i] + y[i]", "x[i] - y[i]")
  with evaluator_lib.Evaluator(workers=1, limits=sandbox.Limits(address_space_limit=False)) as ev:
    r = ev.evaluate(evaluator_lib.EvalRequest(task, wrong, "cuda", "correctness"))
  assert r.status == "wrong_output" and r.first_mismatches and r.mismatch_count > 0
