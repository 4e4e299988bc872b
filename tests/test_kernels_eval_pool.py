"""kernels_eval with its sandboxed workers: embedded solutions, the hardening oracle, validate_task,
the sandbox itself and the pool's recovery. One evaluator (two warm workers) serves the whole module."""
import os
import pathlib

import pytest

import kernels_eval as ke
from kernels_eval import pool as pool_lib
from kernels_eval import skeleton
from kernels_eval import schema
from kernels_eval import trials
from kernels_eval.hardening import pallas_cases

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SECRET = b"test secret for kernels_eval!!!!"
TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def evaluator():
  ev = ke.Evaluator(workers=2, secret=SECRET, timeout_s=TIMEOUT_S,
                    compile_cache_dir=REPO_ROOT / ".cache" / "kernels_eval_jax")
  yield ev
  ev.close()


@pytest.fixture(scope="module")
def hardening_task(tmp_path_factory):
  folder = tmp_path_factory.mktemp("hardening")
  (folder / "level1").mkdir()
  (folder / "level1" / "hardening_relu.py").write_text(pallas_cases.TASK_SOURCE)
  return ke.load_tasks(folder)[0]


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory):
  path = tmp_path_factory.mktemp("outside") / "sentinel.txt"
  path.write_text("untouched")
  return path


@pytest.fixture(scope="module")
def hardening_results(evaluator, hardening_task, sentinel):
  del sentinel
  requests = [ke.EvalRequest(hardening_task, c.source, "pallas", "correctness", f"hard-{c.name}", c.timeout_s)
              for c in pallas_cases.CASES]
  return dict(zip([c.name for c in pallas_cases.CASES], evaluator.evaluate_many(requests)))


EMBEDDED = [t for t in ke.load_tasks() if "pallas" in t.solutions]


@pytest.fixture(scope="module")
def embedded_results(evaluator):
  requests = [ke.EvalRequest(t, t.solutions["pallas"], "pallas", "correctness", f"suite-{t.id}") for t in EMBEDDED]
  return dict(zip([t.id for t in EMBEDDED], evaluator.evaluate_many(requests)))


@pytest.mark.parametrize("task_id", [t.id for t in EMBEDDED])
def test_embedded_pallas_solution_is_correct(embedded_results, task_id):
  r = embedded_results[task_id]
  assert (r.status, r.stage, r.infra_error) == ("correct", "correctness", None), r.feedback
  assert r.trials_passed == r.trials_total == trials.NUM_TRIALS
  assert {"reference", "compile", "lower", "correctness"} <= set(r.provenance.durations)


def test_level0_answer_is_judged_in_its_skeleton(evaluator):
  task = next(t for t in EMBEDDED if t.id == "relu")
  answer = skeleton.skeleton_answer(task, "pallas")
  good, wrong = evaluator.evaluate_many([ke.EvalRequest(task, answer, "pallas", "correctness", "l0-answer"),
                                         ke.EvalRequest(task, "out = x + 1.0\n", "pallas", "correctness", "l0-wrong")])
  assert good.status == "correct", good.feedback
  assert wrong.status == "wrong_output", wrong.feedback


@pytest.mark.parametrize("case", pallas_cases.CASES, ids=lambda c: c.name)
def test_hardening_case_verdict(hardening_results, case):
  r = hardening_results[case.name]
  assert r.infra_error is None, r.infra_error
  assert (r.status, r.stage) == (case.status, case.stage), r.feedback
  if case.rejected_reason is not None:
    assert r.rejected_reason == case.rejected_reason, r.feedback
  if case.flag is not None:
    assert case.flag in r.flags
  assert r.feedback and len(r.feedback.encode()) <= schema.FEEDBACK_MAX_BYTES


def test_nothing_outside_changed_and_pool_still_works(evaluator, hardening_task, hardening_results, sentinel):
  assert len(hardening_results) == len(pallas_cases.CASES)
  assert sentinel.read_text() == "untouched"
  assert not (REPO_ROOT / "sentinel.txt").exists()
  r = evaluator.evaluate(ke.EvalRequest(hardening_task, pallas_cases.GOOD + "\n# again\n", "pallas", "correctness"))
  assert r.status == "correct", r.feedback


def test_feedback_is_useful(hardening_results):
  lower = hardening_results["triton_illegal_block"].feedback
  assert "power of 2" in lower and "Triton lowering failed" in lower
  wrong = hardening_results["off_by_one_tile"]
  assert wrong.feedback.startswith("wrong output in trial 1 of 5") and wrong.first_mismatches
  assert wrong.first_mismatches[0]["index"] == [768]


def test_provenance_seed_and_reproducibility(evaluator, hardening_task, hardening_results):
  r = hardening_results["correct_baseline"]
  assert r.provenance.seed == trials.derive_seed(SECRET, hardening_task.source_hash, "hard-correct_baseline")
  assert r.provenance.toolchain["jax"] and r.provenance.toolchain["platform"] in ("cpu", "gpu")
  assert r.provenance.source_hash == ke.evaluator.source_hash(pallas_cases.GOOD)
  assert schema.EvalResult.from_json(r.to_json()) == r
  again = evaluator.evaluate(ke.EvalRequest(hardening_task, pallas_cases.GOOD, "pallas", "correctness", "other"))
  assert again.provenance.cache_hit and again.request_id == "other" and again.status == "correct"


def test_requested_stages_and_async_submit(evaluator, hardening_task):
  src = pallas_cases.GOOD + "\n# stages\n"
  static = evaluator.evaluate(ke.EvalRequest(hardening_task, src, "pallas", "static"))
  assert (static.status, static.stage) == ("not_run", "static")
  future = evaluator.submit(ke.EvalRequest(hardening_task, src, "pallas", "compile"))
  compiled = future.result(timeout=TIMEOUT_S + 60)
  assert (compiled.status, compiled.stage) == ("not_run", "lower"), compiled.feedback
  assert "correctness" not in compiled.provenance.durations


RELU_TASK = pallas_cases.TASK_SOURCE.replace('ID = "hardening_relu"', 'ID = "{id}"')


def _task(tmp_path, name, body=None, inputs=None, dims=None):
  text = RELU_TASK.replace("{id}", name)
  if body is not None:
    text = text.replace("  return jnp.maximum(x, 0.0)", body)
  if inputs is not None:
    text = text.replace(
        'INPUTS = [{"name": "x", "shape": ["N"], "dtype": "float32", "dist": {"kind": "normal"}}]', inputs)
    text = text.replace("def reference(x):", "def reference(x, y):")
  if dims is not None:
    text = text.replace('DIMS = {"check": [{"N": 1000}, {"N": 256}], "timing": {"N": 1048576}}', dims)
  folder = tmp_path / name / "level1"
  folder.mkdir(parents=True)
  (folder / f"{name}.py").write_text(text)
  return ke.load_tasks(folder.parent)[0]


def test_validate_task_good_and_degenerate(evaluator, tmp_path):
  two_inputs = ('INPUTS = [{"name": "x", "shape": ["N"], "dtype": "float32", "dist": {"kind": "normal"}},'
                ' {"name": "y", "shape": ["N"], "dtype": "float32", "dist": {"kind": "normal"}}]')
  tasks = {
      "good": _task(tmp_path, "good"),
      "zeros": _task(tmp_path, "zeros", body="  return jnp.zeros_like(x)"),
      "constant": _task(tmp_path, "constant", body="  return jnp.ones_like(x) * 3.0"),
      "nan": _task(tmp_path, "nan", body="  return jnp.log(x)"),
      "ignores_y": _task(tmp_path, "ignores_y", body="  return x * 2.0", inputs=two_inputs),
      "raises": _task(tmp_path, "raises", body="  return jnp.dot(x, jnp.ones((3, 3)))"),
      "too_large": _task(tmp_path, "too_large", dims='DIMS = {"check": [{"N": 3000000}], "timing": {"N": 1048576}}'),
  }
  cache = tmp_path / "verdicts"
  verdicts = {k: ke.validate_task(t, evaluator=evaluator, cache_dir=cache) for k, t in tasks.items()}
  assert verdicts["good"].ok and verdicts["good"].reasons == [], verdicts["good"]
  assert verdicts["good"].details["output_shape"] == [1000]
  expected = {"zeros": "tiny_output", "constant": "near_constant_output", "nan": "non_finite_output",
              "ignores_y": "ignores_input: the output does not change when 'y' changes",
              "raises": "reference_error", "too_large": "too_large"}
  for name, prefix in expected.items():
    assert not verdicts[name].ok and any(r.startswith(prefix) for r in verdicts[name].reasons), verdicts[name]
  again = ke.validate_task(tasks["zeros"], evaluator=evaluator, cache_dir=cache)
  assert again.cache_hit and again.reasons == verdicts["zeros"].reasons
  assert (cache / f"task-{tasks['good'].source_hash}.json").is_file()


def test_pool_replaces_workers_after_a_crash_and_after_max_jobs(hardening_task):
  payload = {"task": hardening_task.to_job(), "trials": trials.all_trials(hardening_task, 1, 1), "perturbed": []}
  with pool_lib.WorkerPool({"validate": "kernels_eval.reference_runner:validate"}, workers=1, max_jobs=2) as pool:
    first = pool.submit("validate", payload, 60).result()
    assert first.infra_error is None and first.steps["validate"].messages[0]["kind"] == "reference"
    (worker,) = list(pool._all)  # pylint: disable=protected-access
    os.kill(worker.proc.pid, 9)
    broken = pool.submit("validate", payload, 60).result()
    assert broken.infra_error and "worker" in broken.infra_error
    outcomes = [pool.submit(["validate", "validate"], payload, 60).result() for _ in range(2)]
    assert all(o.infra_error is None and o.steps["validate"].messages[0]["kind"] == "reference" for o in outcomes)
    assert pool.workers_started == 2 and not pool._all  # pylint: disable=protected-access  (retired after 2 jobs)
    unknown = pool.submit("nonexistent", payload, 60).result()
    assert "unknown runner" in unknown.steps["nonexistent"].messages[0]["error"]


@pytest.mark.gpu
def test_gpu_compiled_run_and_timing(evaluator, hardening_task):
  r = evaluator.evaluate(ke.EvalRequest(hardening_task, pallas_cases.GOOD + "\n# gpu\n", "pallas", "full"))
  assert (r.status, r.stage) == ("correct", "timing"), r.feedback
  assert r.timing is not None and r.timing.kernel_ms > 0 and r.timing.reference_ms > 0
