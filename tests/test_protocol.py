"""The frame grammar the parent accepts from a job's steps, and who pays for what (no processes here)."""
import numpy as np
import pytest

from kernels_eval import pool as pool_lib
from kernels_eval import protocol
from kernels_eval import schema
from kernels_eval import task as task_lib
from kernels_eval import verdicts
from kernels_eval.hardening import pallas_cases

N = 2
OUT = np.ones(4, np.float32)
CPU = protocol.Expect(n_trials=N, stages="correctness", timing=False)
GPU_FULL = protocol.Expect(n_trials=N, stages="full", timing=True)


def _stage(s):
  return {"kind": "stage", "stage": s}


def _out(t, value=OUT):
  return {"kind": "output", "trial": t, "output": value}


HONEST = [{"kind": "env", "platform": "cpu"}, _stage("compile"), _stage("lower"), _stage("correctness"), _out(0),
          _out(1), {"kind": "done", "durations": {"compile": 0.1}}]
TIMED = HONEST[:-1] + [_stage("timing"), {"kind": "timing_output", "output": OUT},
                       {"kind": "timing", "kernel_ms": 0.5, "flags": []}, {"kind": "done", "durations": {}}]


def test_honest_reports_are_accepted():
  r = protocol.read_candidate(HONEST, CPU)
  assert r.violation is None and r.ended_by == "done" and len(r.outputs) == N and r.durations == {"compile": 0.1}
  r = protocol.read_candidate(TIMED, GPU_FULL)
  assert r.violation is None and r.timing == {"kernel_ms": 0.5, "flags": []} and r.stage == "timing"
  no_gpu = [_stage("compile"), {"kind": "not_run", "feedback": "no GPU"}, {"kind": "done", "durations": {}}]
  assert protocol.read_candidate(no_gpu, CPU).not_run == {"stage": "compile", "feedback": "no GPU"}
  compile_only = [_stage("compile"), _stage("lower"), {"kind": "done", "durations": {}}]
  assert protocol.read_candidate(compile_only, protocol.Expect(N, "compile", False)).violation is None
  error = [_stage("compile"), {"kind": "error", "stage": "compile", "status": "compile_error", "feedback": "x"}]
  assert protocol.read_candidate(error, CPU).error["status"] == "compile_error"


@pytest.mark.parametrize("frames,expect,fragment", [
    (TIMED, CPU, "timing was not requested"),
    (HONEST[:4] + [_out(1)], CPU, "unexpected `output`"),
    (HONEST[:4] + [_out(0), _out(0)], CPU, "unexpected `output`"),
    (HONEST[:4] + [_out(0), {"kind": "done"}], CPU, "done after 1 of 2"),
    (HONEST + [_stage("timing")], CPU, "after the step ended"),
    (HONEST[:2] + [{"kind": "reference_error", "feedback": "x"}], CPU, "unexpected `reference_error`"),
    (HONEST[:2] + [{"kind": "reference", "outputs": [OUT, OUT]}], CPU, "unexpected `reference`"),
    (HONEST[:2] + [{"kind": "env", "platform": "gpu"}], CPU, "unexpected `env`"),
    ([_stage("correctness")], CPU, "before compile"),
    (HONEST[:3] + [_stage("compile")], CPU, "after 'lower'"),
    (HONEST[:4] + [_out(0, [1, 2])], CPU, "no array"),
    (HONEST[:2] + [{"kind": "error", "stage": "timing", "status": "compile_error"}], CPU, "error frame"),
    (HONEST[:2] + [{"kind": "error", "stage": "compile", "status": "correct"}], CPU, "error frame"),
    (TIMED[:-2] + [{"kind": "timing", "kernel_ms": -1.0}], GPU_FULL, "positive milliseconds"),
    (TIMED[:-3] + [{"kind": "timing", "kernel_ms": 1.0}], GPU_FULL, "unexpected `timing`"),
    (TIMED[:-2] + [{"kind": "done", "durations": {}}], GPU_FULL, "without a timing"),
    (HONEST[:2] + ["not a dict"], CPU, "unexpected `None`"),
    (HONEST[:2] + [{"kind": "telepathy"}], CPU, "unexpected `telepathy`"),
])
def test_out_of_grammar_frames_are_violations(frames, expect, fragment):
  r = protocol.read_candidate(frames, expect)
  assert r.violation is not None and fragment in r.violation, r.violation


def test_reference_report_errors_are_the_harness_s():
  expect = protocol.Expect(N, "full", True)
  good = [{"kind": "env", "platform": "gpu"}, {"kind": "reference", "outputs": [OUT, OUT]},
          {"kind": "timing_reference", "output": OUT, "reference_ms": 2.0}, {"kind": "done", "durations": {}}]
  r = protocol.read_reference(good, expect)
  assert r.error is None and r.reference_ms == 2.0 and len(r.outputs) == 2
  assert "task reference failed" in protocol.read_reference([{"kind": "reference_error", "feedback": "boom"}],
                                                            expect).error
  assert "expected 2 arrays" in protocol.read_reference([{"kind": "reference", "outputs": [OUT]}], expect).error
  assert "without `done`" in protocol.read_reference(good[:2], expect).error


@pytest.fixture(scope="module")
def task():
  return task_lib.parse_task_source(pallas_cases.TASK_SOURCE, "hardening_relu.py", trusted=True)


def _verdict(task, candidate, *, reference=None, expect=CPU, **step):
  reference = reference if reference is not None else [{"kind": "reference", "outputs": [OUT, OUT]},
                                                       {"kind": "done", "durations": {}}]
  outcome = pool_lib.JobOutcome(steps={"reference": pool_lib.StepOutcome(reference),
                                       "pallas": pool_lib.StepOutcome(candidate, **step)})

  def result(status, stage, feedback, **kw):
    return schema.EvalResult(status=status, stage=stage, feedback=feedback, **kw)
  trials = [[np.zeros(4, np.float32)]] * N
  return verdicts.from_outcome(task, expect.stages, outcome, "reference", "pallas", expect, trials, 60.0, result,
                               schema.Provenance())


def test_who_pays(task):
  assert _verdict(task, HONEST).status == "correct"
  wrong = _verdict(task, HONEST[:4] + [_out(0), _out(1, OUT * 2), HONEST[-1]])
  assert (wrong.status, wrong.trials_passed, wrong.infra_error) == ("wrong_output", 1, None)
  forged = _verdict(task, TIMED)
  assert (forged.status, forged.rejected_reason, forged.infra_error) == ("runtime_error", "protocol_violation", None)
  before_start = _verdict(task, [{"kind": "env", "platform": "cpu"}], exit_code=71)
  assert before_start.infra_error and "before loading the candidate" in before_start.infra_error
  died = _verdict(task, HONEST[:4], signal=9)
  assert died.status == "runtime_error" and died.infra_error is None and "signal SIGKILL" in died.feedback
  quiet = _verdict(task, HONEST[:4], exit_code=0)
  assert "without reporting a result" in quiet.feedback and quiet.infra_error is None
  garbled = _verdict(task, HONEST[:4], decode_error="frame 4: undecodable")
  assert garbled.rejected_reason == "protocol_violation" and garbled.infra_error is None
  flood = _verdict(task, HONEST[:4], truncated=True, decode_error="cut-off")
  assert flood.rejected_reason == "output_limit"
  timed_out = _verdict(task, HONEST[:4], timed_out=True)
  assert (timed_out.status, timed_out.stage) == ("timeout", "correctness")
  ref_failed = _verdict(task, HONEST, reference=[{"kind": "reference_error", "feedback": "nan"}])
  assert ref_failed.infra_error and "task reference failed" in ref_failed.infra_error
  surrogate = _verdict(task, HONEST[:2] + [{"kind": "error", "stage": "compile", "status": "compile_error",
                                            "feedback": "\ud800 bad"}])
  assert (surrogate.status, surrogate.infra_error) == ("compile_error", None) and "bad" in surrogate.feedback
  huge = _verdict(task, HONEST[:-1] + [{"kind": "done", "durations": {"x": 10 ** 400}}])
  assert (huge.status, huge.infra_error) == ("correct", None)
  odd_shape = _verdict(task, HONEST[:4] + [_out(0, np.ones((2, 2), np.float32)), _out(1), HONEST[-1]])
  assert (odd_shape.status, odd_shape.infra_error) == ("wrong_output", None)


def test_timing_verdicts_use_the_reference_step_s_time(task):
  reference = [{"kind": "reference", "outputs": [OUT, OUT]},
               {"kind": "timing_reference", "output": OUT, "reference_ms": 2.0}, {"kind": "done", "durations": {}}]
  r = _verdict(task, TIMED, reference=reference, expect=GPU_FULL)
  assert (r.status, r.stage, r.timing.speedup) == ("correct", "timing", 4.0)
  fast = [f if f.get("kind") != "timing" else {"kind": "timing", "kernel_ms": 0.01, "flags": []} for f in TIMED]
  assert "suspicious_speedup" in _verdict(task, fast, reference=reference, expect=GPU_FULL).flags
  wrong = [f if f.get("kind") != "timing_output" else {"kind": "timing_output", "output": OUT * 3} for f in TIMED]
  r = _verdict(task, wrong, reference=reference, expect=GPU_FULL)
  assert (r.status, r.flags) == ("wrong_output", ["timing_output_mismatch"])


def test_a_static_check_that_raises_is_the_candidate_s_compile_error(task):
  from kernels_eval import backends  # pylint: disable=import-outside-toplevel
  from kernels_eval import evaluator  # pylint: disable=import-outside-toplevel
  from kernels_eval import jail  # pylint: disable=import-outside-toplevel

  def check(t, source):
    raise RecursionError(f"maximum recursion depth exceeded ({len(source)} bytes)")
  backend = backends.Backend(lang="raising", fence_tags=(), static_check=check, contract=str, runner="x:y")
  rejection = evaluator.checked_static(backend, task, "((" * 10)
  assert rejection.reason == "static_check_failed" and "RecursionError" in rejection.message

  def no_jail(t, source):
    raise jail.IsolationUnavailable("no namespaces here")
  with pytest.raises(jail.IsolationUnavailable):  # the harness's problem, not the candidate's
    evaluator.checked_static(backends.Backend("nojail", (), no_jail, str, "x:y"), task, "")
