"""The reference job of a KernelBench problem, parent side: its payload, and its frames read strictly.

One job, one step (`kernelbench_reference`, in a fresh sandboxed child; see `kernelbench.reference`).
`cuda_payload` is the payload of the job that runs a CUDA answer on a GPU (`kernelbench.cuda_runner`).
Frames in order: env?, problem, trials, reference, timing_reference?, done; or env?, too_large, done; or
reference_error / crash.
Anything else is an error of the problem or the harness, never of a candidate (no candidate code has run).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from kernels_eval import pool as pool_lib
from kernels_eval import protocol
from kernels_eval import task as task_lib

RUNNER = "kernelbench_reference"
CUDA_RUNNER = "kernelbench_cuda"   # a ModelNew answer on a GPU (`kernelbench.cuda_runner`)
CUDA_BUILD_S = 300.0               # added to a CUDA job's time limit: load_inline compiles torch's headers
KERNELBENCH_TRIALS = 5     # KernelBench's num_correct_trials
EXTRA_TRIALS = 3           # the project's normal-distributed trials on top
MAX_TRIAL_BYTES = 160 << 20  # trial inputs sent in one frame at most (as the evaluator's timing sets)


@dataclasses.dataclass
class ReferenceRun:
  """problem: names, shapes and dtypes of inputs, params and output; trials: each trial's forward inputs
  followed by the parameters (the order a Pallas `solution` takes them); report: the outputs (and the
  reference's device time) as `verdicts` reads them; error: why there is none of that; too_large_bytes: the
size of the trial inputs the runner refused to send (see `reference`)."""
  problem: dict[str, Any] | None = None
  trials: list[list[np.ndarray]] = dataclasses.field(default_factory=list)
  report: protocol.ReferenceReport = dataclasses.field(default_factory=protocol.ReferenceReport)
  error: str | None = None
  too_large_bytes: int = 0


def payload(kb: dict[str, Any], sizes: dict[str, int], seed: int, *, kb_trials: int, extra_trials: int,
            full_size: bool = False, time: bool = False) -> dict[str, Any]:
  return {"kernelbench": {"source": kb["source"], "sizes": sizes, "forward_args": kb["forward_args"],
                          "kb_trials": kb_trials, "extra_trials": extra_trials, "seed": seed,
                          "full_size": full_size, "time": time, "max_bytes": MAX_TRIAL_BYTES}}


def cuda_payload(kb: dict[str, Any], sizes: dict[str, int], seed: int, answer: dict[str, Any], source: str,
                 stages: str, *, time: bool) -> dict[str, Any]:
  """The `kernelbench_cuda` job: the reference job's trials (same sizes and seed, made again in the worker),
  the answer's parts to build (`answers.Answer.to_job()`), its source, and whether to time it."""
  return {**payload(kb, sizes, seed, kb_trials=KERNELBENCH_TRIALS, extra_trials=EXTRA_TRIALS, full_size=True,
                    time=time), "answer": answer, "source": source, "stages": stages}


def _arrays(value: Any, n: int | None = None) -> list[np.ndarray]:
  if not (isinstance(value, list) and all(isinstance(x, np.ndarray) for x in value)) or (
      n is not None and len(value) != n):
    raise protocol.Violation("expected a list of arrays")
  return value


def read(step: pool_lib.StepOutcome | None, n_trials: int) -> ReferenceRun:
  """The run's report (see the module docstring)."""
  run = ReferenceRun()
  if step is None or step.timed_out or step.memory_killed:
    run.error = "the KernelBench reference did not finish (time or memory limit)"
    return run
  kinds = [m.get("kind") if isinstance(m, dict) else None for m in step.messages]
  if kinds and kinds[0] == "env":
    run.report.platform = str(step.messages[0].get("platform", ""))
  body = [m for m, k in zip(step.messages, kinds) if k != "env"]
  for m in body:
    if m.get("kind") in ("reference_error", "crash"):
      run.error = "KernelBench reference failed: " + str(m.get("feedback") or m.get("error", ""))[-1500:]
      return run
  if [m.get("kind") for m in body] == ["too_large", "done"]:
    run.too_large_bytes = int(body[0].get("bytes", 0))
    return run
  expected = ["problem", "trials", "reference", "done"]
  got = [m.get("kind") for m in body if m.get("kind") != "timing_reference"]
  if got != expected:
    run.error = f"KernelBench reference frames {got} (expected {expected}; exit {step.exit_code}, signal {step.signal})"
    return run
  try:
    frames = {m["kind"]: m for m in body}
    run.problem = {k: frames["problem"][k] for k in ("inputs", "params", "output")}
    params = _arrays(frames["trials"]["params"])
    run.trials = [_arrays(x) + params for x in _arrays_lists(frames["trials"]["inputs"], n_trials)]
    run.report.outputs = _arrays(frames["reference"]["outputs"], n_trials)
    if "timing_reference" in frames:
      run.report.timing_output = frames["timing_reference"]["output"]
      run.report.reference_ms = float(frames["timing_reference"]["reference_ms"])
    run.report.durations = {k: float(v) for k, v in frames["done"].get("durations", {}).items()}
  except (protocol.Violation, KeyError, TypeError, ValueError) as e:
    run.error = f"KernelBench reference report is malformed: {e}"
  return run


def _arrays_lists(value: Any, n: int) -> list[list[np.ndarray]]:
  if not (isinstance(value, list) and len(value) == n):
    raise protocol.Violation(f"expected {n} trials of inputs")
  return value


def run_reference(pool, kb: dict[str, Any], sizes: dict[str, int], seed: int, timeout_s: float, *,
                  kb_trials: int = KERNELBENCH_TRIALS, extra_trials: int = EXTRA_TRIALS, full_size: bool = False,
                  time: bool = False) -> ReferenceRun:
  """Runs the reference job on `pool` and reads it."""
  job = payload(kb, sizes, seed, kb_trials=kb_trials, extra_trials=extra_trials, full_size=full_size, time=time)
  outcome = pool.submit(RUNNER, job, timeout_s).result()
  if outcome.infra_error:
    return ReferenceRun(error=outcome.infra_error)
  return read(outcome.steps.get(RUNNER), kb_trials + extra_trials)


def input_specs(problem: dict[str, Any]) -> tuple[task_lib.InputSpec, ...]:
  """The candidate's arguments: forward inputs, then parameters and buffers, as described by the reference."""
  return tuple(task_lib.InputSpec(d["name"], tuple(d["shape"]), d["dtype"], {"kind": "kernelbench"})
               for d in problem["inputs"] + problem["params"])
