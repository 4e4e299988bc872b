"""The Ray executor gives the same verdicts as the local one for the same request ids."""
import pytest

from kernels_eval import evaluator as evaluator_lib
from kernels_eval import task as task_lib

ray = pytest.importorskip("ray")

SECRET = bytes(range(32))
COMPARED = ("status", "stage", "rejected_reason", "trials_passed", "trials_total", "max_abs_error",
            "mismatch_count", "first_mismatches", "flags", "task_id", "lang", "request_id")


@pytest.fixture(scope="module")
def ray_instance():
  ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
  yield
  ray.shutdown()


def _requests():
  task = {t.id: t for t in task_lib.load_tasks()}["add"]
  wrong = task.solutions["pallas"].replace("out = x + y", "out = x - y")
  return [
      evaluator_lib.EvalRequest(task, wrong, "pallas", "correctness", request_id="ray-wrong"),
      evaluator_lib.EvalRequest(task, task.solutions["cuda"], "cuda", "full", request_id="ray-cuda"),
      evaluator_lib.EvalRequest(task, "import os\n", "pallas", "full", request_id="ray-static"),
  ]


def test_ray_results_equal_local_results(ray_instance):
  del ray_instance
  with evaluator_lib.Evaluator("local", workers=1, secret=SECRET) as local:
    expected = local.evaluate_many(_requests())
  with evaluator_lib.Evaluator("ray", workers=1, secret=SECRET) as remote:
    assert remote.pool.platform == "cpu"
    got = remote.evaluate_many(_requests())
  assert [r.status for r in expected] == ["wrong_output", "not_run", "compile_error"]
  assert expected[0].mismatch_count and expected[0].first_mismatches
  for want, have in zip(expected, got):
    assert have.infra_error is None
    assert {k: getattr(have, k) for k in COMPARED} == {k: getattr(want, k) for k in COMPARED}
    assert have.provenance.seed == want.provenance.seed


def test_ray_pool_rejects_no_workers(ray_instance):
  del ray_instance
  from kernels_eval import ray_executor  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="at least one"):
    ray_executor.RayPool({"reference": "kernels_eval.reference_runner:run"}, cpu_workers=0, gpu_workers=0)
