"""KernelBench as a task source: problem files written for these tests in KernelBench's format
(tests/fixtures/kernelbench), loaded, rendered and evaluated for real in the sandbox (Pallas: a right and a
wrong answer each; CUDA: a ModelNew answer compiled by nvcc, `not_run` without a GPU; on a GPU, built with
torch's headers, checked and timed). Without a GPU, the CUDA job's worker decision and the Python side of
ModelNew answers (seeding, trials, frames, verdict) run against CPU torch, with the CUDA kernels stood in for
by the torch ops they compute: only the extension build and the kernels themselves need a GPU."""
import json
import pathlib
import shutil
import sys
import types

import numpy as np
import pytest

from launch import gpu_check
from launch import kernelbench_survey

from kernels_eval import compare
from kernels_eval import evaluator as evaluator_lib
from kernels_eval import pool as pool_lib
from kernels_eval import protocol
from kernels_eval import render
from kernels_eval import schema
from kernels_eval import verdicts
from kernels_eval.kernelbench import answers
from kernels_eval.kernelbench import cuda_runner
from kernels_eval.kernelbench import jobs
from kernels_eval.kernelbench import metrics
from kernels_eval.kernelbench import problems
from kernels_eval.kernelbench import sizes
from kernels_eval.kernelbench import survey
from kernels_eval.kernelbench import tasks as kb_tasks

FIXTURES = gpu_check.KERNELBENCH_FIXTURES
ANSWERS = FIXTURES / "answers"
# problem id -> {"stem": answer file, "right"/"wrong": text substitutions making the right or wrong answer}
CASES = json.loads((ANSWERS / "cases.json").read_text())


def test_problems_parse_without_running():
  found, skipped = problems.find_problems(FIXTURES)
  assert skipped == {}
  assert [(p.id, p.level) for p in found] == [("kb1_1", 1), ("kb1_2", 1), ("kb1_3", 1), ("kb1_4", 1), ("kb1_5", 1),
                                              ("kb2_1", 2)]
  conv = next(p for p in found if p.id == "kb1_4")
  assert conv.constants == {"batch_size": 2, "in_channels": 3, "out_channels": 4, "kernel_size": 3, "height": 128,
                            "width": 96}
  assert conv.forward_args == ("x",)
  assert next(p for p in found if p.id == "kb1_5").forward_args == ("predictions", "targets")
  assert [p.id for p in problems.find_problems(FIXTURES, levels=(2,))[0]] == ["kb2_1"]
  assert [p.id for p in problems.find_problems(FIXTURES / "KernelBench", ids=("kb1_3",))[0]] == ["kb1_3"]


def test_split_by_id_hash_is_disjoint_and_covers():
  train = {p.id for p in problems.find_problems(FIXTURES, split="train")[0]}
  evals = {p.id for p in problems.find_problems(FIXTURES, split="eval")[0]}
  assert not train & evals and train | evals == set(CASES)
  ids = [f"kb{lv}_{n}" for lv in (1, 2, 3) for n in range(1, 101)]
  share = sum(problems.split_of(i) == "eval" for i in ids) / len(ids)
  assert 0.35 < share < 0.65


def test_check_size_rule_and_overrides():
  got = sizes.check_sizes({"batch": 16, "n": 4096, "k": 3, "m": 4096, "big": 20})
  assert got == {"batch": 16, "n": 17, "k": 3, "m": 19, "big": 20}
  assert sizes.check_sizes({"embed": 512, "heads": 8}, 1, "attn", {(1, "attn"): {"embed": 24}}) == {
      "embed": 24, "heads": 8}


def test_compare_int64_bool_and_0d():
  assert compare.compare(np.array([1, 2], np.int64), np.array([1, 2], np.int64), 0.0, 0.0).ok
  assert not compare.compare(np.array([1, 3], np.int64), np.array([1, 2], np.int64), 0.0, 0.0).ok
  assert not compare.compare(np.array([True, False]), np.array([True, True]), 0.0, 0.0).ok
  assert not compare.compare(np.float32(3.0).reshape(()), np.float32(2.0).reshape(()), 1e-2, 1e-2).ok


def test_fast_p_and_per_level_accuracy():
  levels = {"a": 1, "b": 1, "c": 2}
  rows = metrics.per_level(levels, {"a": 1, "b": 3, "c": None}, 3, {"a": 1.6, "b": 0.9, "c": None})
  assert rows[1]["Acc@1"] == 0.5 and rows[1]["Acc@3"] == 1.0 and rows[2]["Acc@3"] == 0.0
  assert rows[1]["fast_0"] == 1.0 and rows[1]["fast_1"] == 0.5 and rows[1]["fast_1.5"] == 0.5
  assert rows[1]["fast_2"] == 0.0 and rows[2]["fast_0"] is None and rows[2]["timed"] == 0


def test_cuda_answer_static_checks():
  good = (ANSWERS / "2_Mean_over_rows_cuda.py").read_text()
  assert answers.check_answer(good)[1] is None
  linked = good.replace('functions=["row_mean_cuda"])', 'functions=["row_mean_cuda"], extra_ldflags=["-lcublas"])')
  assert answers.check_answer(linked)[1].reason == answers.FORMAT
  assert answers.check_answer(good + "\nimport os\n")[1].reason == answers.FORMAT
  asm = good.replace("float acc = 0.0f;", 'float acc = 0.0f; asm("nop;");')
  assert answers.check_answer(asm)[1].reason == "inline_asm"
  fast = good.replace('functions=["row_mean_cuda"])',
                      'functions=["row_mean_cuda"], extra_cflags=[""], extra_cuda_cflags=["-O3", "--use_fast_math"])')
  assert answers.check_answer(fast)[0].extra_cuda_cflags == ("-O3", "--use_fast_math")
  for flags in ('["-Xcompiler", "-fplugin=/tmp/p.so"]', '["-I/etc"]', '["-O3 -include /etc/passwd"]'):
    unsafe = good.replace('functions=["row_mean_cuda"])', f'functions=["row_mean_cuda"], extra_cuda_cflags={flags})')
    assert answers.check_answer(unsafe)[1].reason == answers.FORMAT, flags
  undeclared = good.replace('cpp_sources="torch::Tensor row_mean_cuda(torch::Tensor x);"', 'cpp_sources="torch::Tensor other(torch::Tensor x);"')
  assert answers.check_answer(undeclared)[1].reason == answers.FORMAT


@pytest.fixture(scope="module")
def loaded():
  # A fixed secret and request ids (below) fix the trial seeds: the project's 3 normal trials catch the unclipped
  # HardSigmoid only when a draw passes |x| > 3, which a random seed misses about one run in ten.
  with evaluator_lib.Evaluator(workers=2, secret=b"kernelbench-tests-secret") as ev:
    tasks, skipped = kb_tasks.load_tasks(str(FIXTURES), ev)
    yield ev, {t.id: t for t in tasks}, skipped


def test_every_fixture_loads_and_renders(loaded):
  _, tasks, skipped = loaded
  assert skipped == {} and sorted(tasks) == sorted(CASES)
  linear = tasks["kb2_1"]
  assert linear.input_names == ["x", "linear_weight", "linear_bias"]
  assert [i.shape for i in linear.inputs] == [(17, 19), (21, 19), (21,)]
  assert tasks["kb1_3"].kernelbench["output"] == {"name": "out", "shape": [8, 19], "dtype": "int32",
                                                  "torch_dtype": "int64"}
  assert tasks["kb1_5"].kernelbench["output"]["shape"] == []
  text = render.render_task(linear, "pallas")
  assert "nn.Linear(in_features, out_features)" in text and "def solution(x, linear_weight, linear_bias)" in text
  assert "ModelNew" in render.render_task(linear, "cuda")


def test_right_wrong_and_cuda_answers(loaded):
  ev, tasks, _ = loaded
  if ev.pool.platform != "cpu":
    pytest.skip("the verdicts of a CPU machine; a GPU's are in test_cuda_answers_on_gpu and launch/gpu_check.py")
  requests = []
  for pid, case in CASES.items():
    requests += [evaluator_lib.EvalRequest(tasks[pid], gpu_check.kernelbench_answer(pid, which), "pallas",
                                           request_id=f"{pid}-{which}") for which in ("right", "wrong")]
    requests += [
                 evaluator_lib.EvalRequest(tasks[pid], (ANSWERS / f"{case['stem']}_cuda.py").read_text(), "cuda")]
  results = ev.evaluate_many(requests)
  table = {pid: tuple(r.status for r in results[3 * i:3 * i + 3]) for i, pid in enumerate(CASES)}
  assert all(r.infra_error is None for r in results), [r.infra_error for r in results]
  assert table == {pid: ("correct", "wrong_output", "not_run") for pid in CASES}, table
  right, wrong, cuda = results[0:3]
  assert right.trials_total == 8 and "timing_skipped" in right.flags
  assert "stricter_than_kernelbench" in wrong.flags  # HardSigmoid without its clip passes U[0, 1) inputs
  assert all("stricter_than_kernelbench" not in r.flags for r in results[4::3])
  assert cuda.feedback.startswith("not_run: no GPU") and cuda.stage == "compile"


def test_cuda_answer_outside_the_torch_api_is_a_compile_error(loaded):
  ev, tasks, _ = loaded
  source = (ANSWERS / "1_Linear_ReLU_cuda.py").read_text().replace(
      "auto y = torch::empty({m, n}, x.options());", "auto y = torch::matmul(x, w);")
  result = ev.evaluate(evaluator_lib.EvalRequest(tasks["kb2_1"], source, "cuda"))
  assert (result.status, result.stage) == ("compile_error", "compile")
  assert "matmul" in result.feedback


# The torch ops each fixture answer's CUDA kernels compute (the right ones), keyed by problem id.
STAND_INS = {
    "kb1_1": lambda torch: {"hardsigmoid_cuda": lambda x: torch.clamp(x / 6.0 + 0.5, 0.0, 1.0)},
    "kb1_2": lambda torch: {"row_mean_cuda": lambda x: x.mean(dim=1)},
    "kb1_3": lambda torch: {"argmax_cuda": lambda x: torch.argmax(x, dim=1)},
    "kb1_4": lambda torch: {"conv2d_cuda": torch.nn.functional.conv2d},
    "kb1_5": lambda torch: {"mse_cuda": lambda p, t: ((p - t) ** 2).mean()},
    "kb2_1": lambda torch: {"linear_relu_cuda": lambda x, w, b: torch.relu(x @ w.T + b)},
}


def _cuda_job(ev, task, source: str, stages: str = "correctness"):
  """(the reference run at the check sizes, the `kernelbench_cuda` payload for the same trials)."""
  kb, seed = task.kernelbench, ev.seed_for(task, "cuda-job")
  run = jobs.run_reference(ev.pool, kb, kb["sizes"], seed, 120.0)
  answer, rejection = answers.check_answer(source)
  assert run.error is None and rejection is None, (run.error, rejection)
  return run, jobs.cuda_payload(kb, kb["sizes"], seed, answer.to_job(), source, stages, time=False)


def _verdict(task, run, messages, stages: str = "correctness") -> schema.EvalResult:
  """The parent's verdict on a candidate step that sent `messages`."""
  def result(status, stage, feedback, **kw):
    return schema.EvalResult(status=status, stage=stage, feedback=feedback, task_id=task.id, lang="cuda", **kw)
  expect = protocol.Expect(len(run.trials), stages, timing=False)
  return verdicts.from_candidate(task, stages, run.report, pool_lib.StepOutcome(messages=messages, exit_code=0),
                                 expect, run.trials, 60.0, result, schema.Provenance())


def test_cuda_job_payload_and_worker_without_gpu(loaded):
  """The job a GPU would run, run here: the worker itself decides not_run when torch sees no CUDA device."""
  ev, tasks, _ = loaded
  task = tasks["kb2_1"]
  source = (ANSWERS / "1_Linear_ReLU_cuda.py").read_text()
  run, payload = _cuda_job(ev, task, source)
  kb = payload["kernelbench"]
  assert (kb["kb_trials"], kb["extra_trials"], kb["sizes"], kb["time"]) == (5, 3, task.kernelbench["sizes"], False)
  assert list(payload["answer"]["functions"]) == ["linear_relu_cuda"] and payload["source"] == source
  outcome = ev.pool.submit([jobs.CUDA_RUNNER], payload, 120.0).result()
  assert outcome.infra_error is None
  step = outcome.steps[jobs.CUDA_RUNNER]
  assert [m["kind"] for m in step.messages] == ["env", "stage", "not_run", "done"]
  verdict = _verdict(task, run, step.messages)
  assert (verdict.status, verdict.stage, verdict.infra_error) == ("not_run", "compile", None)
  assert verdict.feedback.startswith("not_run: no GPU (torch sees no CUDA device")


@pytest.mark.parametrize("pid", sorted(STAND_INS))
def test_cuda_answer_python_side_on_cpu_torch(loaded, pid):
  """ModelNew built with the reference's seeding (parameters match), run on the reference job's trials
  (made again from the seed), its frames judged by the parent: right -> correct; the same answer with one
  kernel's result off -> wrong_output."""
  import torch  # pylint: disable=import-outside-toplevel
  ev, tasks, _ = loaded
  task = tasks[pid]
  run, payload = _cuda_job(ev, task, (ANSWERS / f"{CASES[pid]['stem']}_cuda.py").read_text())
  right = STAND_INS[pid](torch)
  wrong = {name: (lambda fn: lambda *a: fn(*a) + 1)(fn) for name, fn in right.items()}
  statuses = []
  for functions in (right, wrong):
    frames = [{"kind": "env", "platform": "cpu"}, {"kind": "stage", "stage": "compile"}]
    durations = cuda_runner.judge(torch, payload, lambda f=functions: types.SimpleNamespace(**f), frames.append,
                                  "cpu")
    verdict = _verdict(task, run, frames + [{"kind": "done", "durations": durations}])
    statuses.append((verdict.status, verdict.trials_passed, verdict.infra_error))
  assert statuses == [("correct", 8, None), ("wrong_output", 0, None)], statuses


def test_cuda_answer_python_errors_are_the_answers(loaded):
  import torch  # pylint: disable=import-outside-toplevel
  ev, tasks, _ = loaded
  source = (ANSWERS / "1_Linear_ReLU_cuda.py").read_text()
  run, payload = _cuda_job(ev, tasks["kb2_1"], source)
  cases = {"compile": source.replace("class ModelNew", "raise ValueError('at import')\nclass ModelNew"),
           "correctness": source.replace("self.linear.bias)", "self.linear.bias, 1)")}
  for stage, bad in cases.items():
    frames = [{"kind": "stage", "stage": "compile"}]
    assert cuda_runner.judge(torch, {**payload, "source": bad}, lambda: types.SimpleNamespace(
        **STAND_INS["kb2_1"](torch)), frames.append, "cpu") == {}
    verdict = _verdict(tasks["kb2_1"], run, frames)
    assert (verdict.stage, verdict.infra_error) == (stage, None), verdict
    assert verdict.status == ("compile_error" if stage == "compile" else "runtime_error")


@pytest.mark.gpu
def test_cuda_answers_on_gpu(loaded):
  """Every fixture's ModelNew answer built with torch's headers, checked at full size and timed; a wrong one."""
  ev, tasks, _ = loaded
  requests = [evaluator_lib.EvalRequest(tasks[pid], (ANSWERS / f"{c['stem']}_cuda.py").read_text(), "cuda", "full")
              for pid, c in CASES.items()]
  wrong = (ANSWERS / "1_Linear_ReLU_cuda.py").read_text().replace("float acc = b[col];", "float acc = 0.0f;")
  requests.append(evaluator_lib.EvalRequest(tasks["kb2_1"], wrong, "cuda", "full"))
  results = ev.evaluate_many(requests)
  assert all(r.infra_error is None for r in results), [r.infra_error for r in results]
  assert [r.status for r in results] == ["correct"] * len(CASES) + ["wrong_output"], [r.feedback for r in results]
  assert all(r.timing is not None and r.timing.speedup > 0 for r in results[:-1])


def test_cpp_answer_built_by_load_inline_runs_on_cpu_torch(loaded, tmp_path):
  """The worker's build path with CPU torch: the answer's parts built by torch's load_inline without importing
  them, then imported, bound into ModelNew and judged (a C++-only variant of the row-mean answer: a CUDA
  build needs a GPU host's torch)."""
  import torch  # pylint: disable=import-outside-toplevel
  from torch.utils import cpp_extension  # pylint: disable=import-outside-toplevel
  ev, tasks, _ = loaded
  source = (ANSWERS / "2_Mean_over_rows_cuda.py").read_text()
  run, payload = _cuda_job(ev, tasks["kb1_2"], source)
  cpp = "torch::Tensor row_mean_cuda(torch::Tensor x) { return x.sum(1) / x.size(1); }"
  path = cuda_runner.build_extension(cpp_extension, {**payload["answer"], "cpp_source": cpp, "cuda_source": ""},
                                     str(tmp_path / "build"))
  assert pathlib.Path(path).is_file() and cuda_runner.EXTENSION not in sys.modules
  frames = [{"kind": "stage", "stage": "compile"}]
  durations = cuda_runner.judge(torch, payload, lambda: cuda_runner.import_extension(path), frames.append, "cpu")
  verdict = _verdict(tasks["kb1_2"], run, frames + [{"kind": "done", "durations": durations}])
  assert (verdict.status, verdict.trials_passed) == ("correct", 8), verdict.feedback


def test_heldout_is_the_kernelbench_eval_split_and_cuda_sft_refuses(loaded):
  from configs import smoke  # pylint: disable=import-outside-toplevel
  from leap_jax.train import build, sft  # pylint: disable=import-outside-toplevel
  from leap_jax.train.config import HeldoutConfig, TasksConfig, TrainConfig  # pylint: disable=import-outside-toplevel
  ev, _, _ = loaded
  train_ids = tuple(p.id for p in problems.find_problems(FIXTURES, split="train")[0])
  tasks = TasksConfig(levels=(1, 2), ids=train_ids[:1], kernelbench_dir=str(FIXTURES))
  heldout = build.heldout_tasks(tasks, HeldoutConfig(levels=(0,), split="train"), ev)
  assert sorted(t.id for t in heldout) == sorted(p.id for p in problems.find_problems(FIXTURES, split="eval")[0])
  assert all(t.kernelbench is not None for t in heldout)
  embedded = build.heldout_tasks(TasksConfig(), HeldoutConfig(levels=(1,)))
  assert embedded and all(t.kernelbench is None and t.split == "eval" and t.level == 1 for t in embedded)
  cfg = smoke.get_config()
  cfg.tasks.lang, cfg.tasks.kernelbench_dir, cfg.sft.enabled = "cuda", str(FIXTURES), True
  with pytest.raises(ValueError, match=r"sft\.enabled.*tasks\.kernelbench_dir.*tasks\.lang"):
    sft.cold_start(TrainConfig.from_dict(cfg.to_dict()))


def test_survey_counts_what_loads_and_names_what_does_not(loaded, tmp_path, capsys):
  """The survey command on the fixtures plus a file that does not parse, one whose reference fails and one with
  dropout (run in eval mode)."""
  ev, _, _ = loaded
  clone = tmp_path / "clone"
  shutil.copytree(FIXTURES / "KernelBench", clone / "KernelBench")
  level1 = clone / "KernelBench" / "level1"
  (level1 / "7_No_inputs.py").write_text("import torch\nclass Model(torch.nn.Module):\n  pass\n")
  broken = (level1 / "2_Mean_over_rows.py").read_text().replace("return [torch.", "return [torch.nonexistent(), torch.")
  (level1 / "8_Broken_reference.py").write_text(broken)
  dropout = (level1 / "2_Mean_over_rows.py").read_text().replace("super().__init__()", (
      "super().__init__()\n        self.drop = nn.Dropout(p=0.5)")).replace(
      "return torch.mean(x, dim=self.dim)", "return self.drop(torch.mean(x, dim=self.dim))")
  (clone / "KernelBench" / "level2" / "9_Mean_dropout.py").write_text(dropout)
  result = survey.survey(str(clone), ev)
  assert result["levels"] == {1: {"files": 7, "parsed": 6, "loaded": 5, "dropout_eval": 0},
                              2: {"files": 2, "parsed": 2, "loaded": 2, "dropout_eval": 1}}
  assert set(result["skipped"]) == {"level1/7_No_inputs.py", "kb1_8"}
  assert "get_inputs" in result["skipped"]["level1/7_No_inputs.py"]
  assert "nonexistent" in result["skipped"]["kb1_8"]
  out = tmp_path / "survey.json"
  assert kernelbench_survey.main([str(FIXTURES), "--levels", "2", "--workers", "1", "--out", str(out)]) == 0
  assert "| 2 | 1 | 1 | 1 | 0 |" in capsys.readouterr().out
  assert json.loads(out.read_text())["levels"] == {"2": {"files": 1, "parsed": 1, "loaded": 1, "dropout_eval": 0}}
  with pytest.raises(SystemExit, match="no KernelBench problem files"):
    kernelbench_survey.main([str(tmp_path / "empty")])
