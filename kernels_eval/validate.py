"""Task validation: run the reference in the sandbox and reject degenerate tasks.

A task is rejected when: its input sizes pass the caps (check: 2**20 elements per input, timing: 2**28);
its reference fails, times out, or returns a non-float/int array; any output is non-finite; outputs
are tiny (max |out| < 1e-6) or near-constant (max - min <= 1e-6 * max |out| over all trials); a rerun
on the same inputs differs bitwise (nondeterminism); or redrawing one input leaves the output
unchanged within tolerance (the output ignores that input). Verdicts are cached on disk by the task's
source hash (`cache_dir`, default env KERNELS_EVAL_CACHE or ~/.cache/kernels_eval).
Tasks outside the embedded suite also get the candidates' static checks on their reference.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import numpy as np

from kernels_eval import static_check
from kernels_eval import task as task_lib
from kernels_eval import trials as trials_lib

MAX_CHECK_ELEMENTS = 1 << 20
MAX_TIMING_ELEMENTS = 1 << 28
TINY = 1e-6
VALIDATION_KEY = b"kernels_eval task validation key"
VALIDATION_TIMEOUT_S = 60.0
VERDICT_VERSION = 1


@dataclasses.dataclass
class TaskVerdict:
  ok: bool
  task_id: str
  source_hash: str
  reasons: list[str] = dataclasses.field(default_factory=list)
  details: dict[str, Any] = dataclasses.field(default_factory=dict)
  cache_hit: bool = False


def default_cache_dir() -> pathlib.Path:
  env = os.environ.get("KERNELS_EVAL_CACHE")
  return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "kernels_eval"


def _judge(task: task_lib.Task, job, perturbed_names) -> tuple[list[str], dict[str, Any]]:
  if job.infra_error or "validate" not in job.steps:
    return [f"infra_error: {job.infra_error or 'the validation step did not run'}"], {}
  outcome = job.steps["validate"]
  msgs = {m.get("kind"): m for m in outcome.messages if isinstance(m, dict)}
  if outcome.timed_out:
    return ["too_slow: reference exceeded the time cap"], {}
  if outcome.memory_killed:
    return ["too_large: reference exceeded the memory cap"], {}
  if "error" in msgs or "crash" in msgs:
    m = msgs.get("error") or msgs["crash"]
    return ["reference_error: " + str(m.get("feedback") or m.get("error", ""))[-600:]], {}
  if "done" not in msgs:
    return [f"reference_error: process died (signal {outcome.signal}, exit {outcome.exit_code})"], {}
  outs = msgs["reference"]["outputs"]
  reasons: list[str] = []
  dtype = outs[0].dtype.name
  details = {"output_shape": list(outs[0].shape), "output_dtype": dtype}
  if dtype not in task_lib.DTYPES:
    return [f"bad_output_dtype: {dtype} (allowed {task_lib.DTYPES})"], details
  flat = np.concatenate([o.astype(np.float64).ravel() for o in outs])
  if not np.all(np.isfinite(flat)):
    reasons.append("non_finite_output")
    return reasons, details
  peak = float(np.abs(flat).max()) if flat.size else 0.0
  details["max_abs_output"] = peak
  if dtype != "int32" and peak < TINY:
    reasons.append(f"tiny_output: max |out| = {peak:.3g}")
  elif flat.size and float(flat.max() - flat.min()) <= TINY * max(peak, 1e-30):
    reasons.append("near_constant_output")
  repeat = msgs["repeat"]["outputs"][0]
  if not np.array_equal(repeat, outs[0], equal_nan=True):
    reasons.append("nondeterministic: two runs on the same inputs differ")
  tol = task.tolerance_for(dtype)
  for name, out in zip(perturbed_names, msgs["perturbed"]["outputs"]):
    if out.shape == outs[0].shape and np.allclose(out.astype(np.float64), outs[0].astype(np.float64),
                                                  atol=tol["atol"], rtol=tol["rtol"]):
      reasons.append(f"ignores_input: the output does not change when {name!r} changes")
  return reasons, details


def validate_task(task: task_lib.Task, *, evaluator=None, cache_dir: str | os.PathLike | None = None,
                  use_cache: bool = True, timeout_s: float = VALIDATION_TIMEOUT_S) -> TaskVerdict:
  """Validates `task` (see the module docstring); `evaluator` provides the worker pool."""
  cache = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
  cache_file = cache / f"task-{task.source_hash}.json"
  if use_cache and cache_file.is_file():
    try:
      data = json.loads(cache_file.read_text())
      if data.pop("version", None) == VERDICT_VERSION:
        return TaskVerdict(**{**data, "cache_hit": True})
    except (OSError, ValueError, TypeError):
      pass
  verdict = TaskVerdict(ok=False, task_id=task.id, source_hash=task.source_hash)
  sizes = task_lib.task_sizes(task)
  verdict.details.update(sizes)
  if sizes["check_elements"] > MAX_CHECK_ELEMENTS:
    verdict.reasons.append(f"too_large: a check input has {sizes['check_elements']} elements "
                           f"(cap {MAX_CHECK_ELEMENTS})")
  if sizes["timing_elements"] > MAX_TIMING_ELEMENTS:
    verdict.reasons.append(f"too_large: a timing input has {sizes['timing_elements']} elements "
                           f"(cap {MAX_TIMING_ELEMENTS})")
  if not task.trusted:
    problem = static_check.check_reference(task.reference_source)
    if problem is not None:
      verdict.reasons.append(f"unsafe_reference: {problem.feedback()}")
  if not verdict.reasons:
    if evaluator is None:
      from kernels_eval import evaluator as evaluator_lib  # pylint: disable=import-outside-toplevel
      evaluator = evaluator_lib.default_evaluator()
    seed = trials_lib.derive_seed(VALIDATION_KEY, task.source_hash, "validate")
    trials = trials_lib.all_trials(task, seed)
    perturbed = []
    for i in range(len(task.inputs)):
      inputs = list(trials[0])
      inputs[i] = trials_lib.trial_inputs(task, seed + 1 + i, 0)[i]
      perturbed.append(inputs)
    payload = {"task": task.to_job(), "trials": trials, "perturbed": perturbed}
    outcome = evaluator.run_job("validate", payload, timeout_s).result()
    reasons, details = _judge(task, outcome, task.input_names)
    verdict.reasons += reasons
    verdict.details.update(details)
    if any(r.startswith("infra_error") for r in reasons):
      return verdict
  verdict.ok = not verdict.reasons
  try:
    cache.mkdir(parents=True, exist_ok=True)
    record = {**dataclasses.asdict(verdict), "version": VERDICT_VERSION}
    record.pop("cache_hit")
    tmp = cache_file.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, sort_keys=True))
    tmp.replace(cache_file)
  except OSError:
    pass
  return verdict
