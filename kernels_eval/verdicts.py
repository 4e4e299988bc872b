"""A job's verdict, made in the parent from its two steps' reports (`kernels_eval.protocol`).

Who pays: anything wrong in the reference step, or in the candidate step before it reached
`stage:compile` (no candidate code had run), is an infrastructure error (`infra_error`: retried, never
penalised). From `stage:compile` on, every failure is the candidate's: its own error or crash, a
timeout, the memory cap, the output cap, a process that died, a frame the protocol refuses
(`protocol_violation`). Outputs are compared here (`compare`), never in a process that ran candidate
code; so is the output of a timed run at the timing sizes.
"""
from __future__ import annotations

import signal as signal_lib
from typing import Callable

import numpy as np

from kernels_eval import compare
from kernels_eval import pool as pool_lib
from kernels_eval import protocol
from kernels_eval import schema
from kernels_eval import task as task_lib

SUSPICIOUS_SPEEDUP = 10.0

Result = Callable[..., schema.EvalResult]   # result(status, stage, feedback, **fields)


def _tolerance(task: task_lib.Task, ref: np.ndarray) -> dict[str, float]:
  return task.tolerance_for(ref.dtype.name)


def _died(step: pool_lib.StepOutcome, stage: str, result: Result) -> schema.EvalResult:
  if not step.signal:
    return result("runtime_error", stage, f"the process exited (code {step.exit_code}) in stage {stage} without "
                  "reporting a result")
  try:
    name = signal_lib.Signals(step.signal).name
  except ValueError:
    name = str(step.signal)
  flags = ["memory_limit"] if step.signal in (signal_lib.SIGKILL, signal_lib.SIGSEGV, signal_lib.SIGABRT) else []
  return result("runtime_error", stage, f"the process died in stage {stage} (signal {name}); out of memory or an "
                "illegal operation", flags=flags)


def _ended_badly(step: pool_lib.StepOutcome, cand: protocol.CandidateReport, timeout: float,
                 result: Result) -> schema.EvalResult | None:
  """The verdict when the candidate step did not end with `done` (or a clean `not_run`), else None."""
  stage = cand.stage
  if step.timed_out:
    return result("timeout", stage, f"timed out after {timeout:g} s in stage {stage} (infinite loop, or too "
                  "much work for the check sizes)")
  if step.memory_killed:
    return result("runtime_error", stage, f"killed in stage {stage}: memory use above the sandbox limit",
                  flags=["memory_limit"])
  if step.truncated:
    return result("runtime_error", stage, f"the job's report passed the output cap in stage {stage}",
                  rejected_reason="output_limit")
  violation = cand.violation or (step.decode_error and f"unreadable report ({step.decode_error})")
  if violation:
    return result("runtime_error", stage, f"the job broke the harness protocol in stage {stage}: {violation}",
                  rejected_reason="protocol_violation")
  if cand.error is not None:
    status, err_stage = cand.error["status"], cand.error["stage"]
    head = f"{status.replace('_', ' ')} (stage {err_stage}): "
    return result(status, err_stage, head + cand.error["feedback"], rejected_reason=cand.error["rejected_reason"])
  if cand.crash is not None:
    return result("runtime_error", stage, f"runtime error (stage {stage}): the process crashed:\n{cand.crash}")
  if cand.ended_by is None:
    return _died(step, stage, result)
  return None


def _outputs(task: task_lib.Task, ref: list[np.ndarray], got: list[np.ndarray], trial_inputs: list,
             result: Result) -> schema.EvalResult | None:
  n = len(ref)
  for t in range(n):
    tol = _tolerance(task, ref[t])
    cmp = compare.compare(got[t], ref[t], tol["atol"], tol["rtol"])
    if not cmp.ok:
      shapes = ", ".join(f"{s.name}{list(x.shape)}" for s, x in zip(task.inputs, trial_inputs[t]))
      return result("wrong_output", "correctness", f"wrong output in trial {t + 1} of {n} (inputs {shapes}): "
                    f"{cmp.message}", trials_passed=t, trials_total=n, max_abs_error=cmp.max_abs_error,
                    max_rel_error=cmp.max_rel_error, mismatch_count=cmp.mismatch_count,
                    first_mismatches=cmp.first_mismatches)
  return None


def _timed(task: task_lib.Task, ref: protocol.ReferenceReport, cand: protocol.CandidateReport, n: int,
           result: Result) -> schema.EvalResult:
  timing = cand.timing
  if ref.timing_output is None or ref.reference_ms is None:
    return result("runtime_error", "timing", "", infra_error="the reference step was not timed at the timing sizes")
  tol = _tolerance(task, ref.timing_output)
  cmp = compare.compare(cand.timing_output, ref.timing_output, tol["atol"], tol["rtol"])
  if not cmp.ok:
    return result("wrong_output", "timing", f"wrong output at the timing sizes: {cmp.message}", trials_passed=n,
                  trials_total=n, flags=["timing_output_mismatch"], max_abs_error=cmp.max_abs_error,
                  mismatch_count=cmp.mismatch_count, first_mismatches=cmp.first_mismatches)
  k, r = timing["kernel_ms"], ref.reference_ms
  speedup = r / k
  flags = list(timing["flags"]) + (["suspicious_speedup"] if speedup > SUSPICIOUS_SPEEDUP else [])
  return result("correct", "timing", f"correct: {n} of {n} trials passed; kernel {k:.4g} ms vs reference "
                f"{r:.4g} ms (speedup {speedup:.3g}x)", trials_passed=n, trials_total=n,
                timing=schema.Timing(kernel_ms=k, reference_ms=r, speedup=speedup), flags=flags)


def from_outcome(task: task_lib.Task, stages: str, outcome: pool_lib.JobOutcome, reference_step: str,
                 candidate_step: str, expect: protocol.Expect, trial_inputs: list, timeout: float,
                 result: Result, prov: schema.Provenance) -> schema.EvalResult:
  """The EvalResult of one job (see the module docstring); `prov` gets the steps' platform and durations."""
  if outcome.infra_error:
    return result("runtime_error", "compile", "", infra_error=outcome.infra_error)
  ref_step, cand_step = outcome.steps.get(reference_step), outcome.steps.get(candidate_step)
  if ref_step is None or ref_step.timed_out:
    return result("runtime_error", "compile", "", infra_error=f"task reference did not finish in {timeout:g} s")
  ref = protocol.read_reference(ref_step.messages, expect)
  if ref.error is not None:
    return result("runtime_error", "compile", "", infra_error=ref.error[-1000:])
  return from_candidate(task, stages, ref, cand_step, expect, trial_inputs, timeout, result, prov)


def from_candidate(task: task_lib.Task, stages: str, ref: protocol.ReferenceReport,
                   cand_step: pool_lib.StepOutcome | None, expect: protocol.Expect, trial_inputs: list,
                   timeout: float, result: Result, prov: schema.Provenance) -> schema.EvalResult:
  """The verdict of a candidate step against a reference report read without error (from the same job, or,
  for a KernelBench problem, from the job that ran its torch reference)."""
  prov.durations.update({k: round(v, 6) for k, v in ref.durations.items()})
  if cand_step is None:
    return result("runtime_error", "compile", "", infra_error="the candidate step did not run")
  cand = protocol.read_candidate(cand_step.messages, expect)
  if not cand.started:
    how = f"exit {cand_step.exit_code}, signal {cand_step.signal}, timed out {cand_step.timed_out}"
    return result("runtime_error", "compile", "", infra_error=f"the candidate step failed before loading the "
                  f"candidate ({how}): the sandbox or the worker is broken; see the worker log")
  prov.durations.update({k: round(v, 6) for k, v in cand.durations.items()})
  if cand.platform:
    prov.toolchain["platform"] = cand.platform
  try:
    return _judged(task, stages, ref, cand_step, cand, trial_inputs, timeout, result)
  except Exception as e:  # noqa: BLE001  (after stage:compile, a report that cannot be judged is the candidate's)
    return result("runtime_error", cand.stage, f"the job's report could not be judged ({type(e).__name__})",
                  rejected_reason="protocol_violation")


def _judged(task: task_lib.Task, stages: str, ref: protocol.ReferenceReport, cand_step: pool_lib.StepOutcome,
            cand: protocol.CandidateReport, trial_inputs: list, timeout: float, result: Result) -> schema.EvalResult:
  bad = _ended_badly(cand_step, cand, timeout, result)
  if bad is not None:
    return bad
  if stages == "compile":
    return result("not_run", cand.stage, "compiled and lowered; correctness not requested")
  if cand.not_run is not None:
    return result("not_run", cand.not_run["stage"], cand.not_run["feedback"])
  wrong = _outputs(task, ref.outputs, cand.outputs, trial_inputs, result)
  if wrong is not None:
    return wrong
  n = len(ref.outputs)
  if cand.timing is not None:
    return _timed(task, ref, cand, n, result)
  return result("correct", "correctness", f"correct: {n} of {n} trials passed", trials_passed=n, trials_total=n)
