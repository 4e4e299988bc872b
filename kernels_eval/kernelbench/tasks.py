"""KernelBench problems as evaluator tasks (`Task` with its `kernelbench` field set).

`load_tasks(folder, evaluator)` parses the selected problem files (`problems`), runs each reference once in
the sandbox at its check sizes (`sizes`) with one KernelBench trial to learn the names, shapes and dtypes of
its inputs, parameters and output, and returns (tasks, skipped {file or id: reason}). A problem whose
reference fails there, or that returns something other than one tensor, is skipped with the reason.

Tolerances are KernelBench's (atol = rtol = 1e-2) unless `tolerance` is given; integer and bool outputs
compare exactly. External suites are not subject to the embedded suite's element caps (`validate`).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Sequence

from kernels_eval import task as task_lib
from kernels_eval.kernelbench import jobs
from kernels_eval.kernelbench import problems as problems_lib
from kernels_eval.kernelbench import sizes as sizes_lib

KERNELBENCH_TOLERANCE = 1e-2
LOAD_SEED = 0
LOAD_TIMEOUT_S = 120.0


def _tolerance(tol: float) -> dict[str, dict[str, float]]:
  return {dtype: {"atol": tol, "rtol": tol} for dtype in ("float32", "float16", "bfloat16")}


def statement(problem: problems_lib.Problem) -> str:
  dropout = (" Its dropout layers run in eval mode (identity), so the output is deterministic."
             if problem.uses_dropout else "")
  return (f"KernelBench level {problem.level} problem {problem.name}: compute `Model.forward` of the PyTorch "
          f"module below, with the module built as `Model(*get_init_inputs())` and called on `get_inputs()`."
          f"{dropout}")


def make_task(problem: problems_lib.Problem, described: dict[str, Any], check: dict[str, int],
              tolerance: float = KERNELBENCH_TOLERANCE) -> task_lib.Task:
  """The task of a problem whose reference was described at the check sizes `check`."""
  kb = {"source": problem.source, "sizes": check, "full_sizes": dict(problem.constants),
        "forward_args": list(problem.forward_args), "name": problem.name, **described,
        "dropout_eval": problem.uses_dropout}
  digest = hashlib.sha256(json.dumps([problem.source, check, tolerance], sort_keys=True).encode()).hexdigest()
  return task_lib.Task(id=problem.id, level=problem.level, split=problem.split, family="kernelbench",
                       statement=statement(problem), dims={"check": [check], "timing": dict(problem.constants)},
                       inputs=jobs.input_specs(described), tolerance=_tolerance(tolerance),
                       reference_source=problem.source, solutions={}, skeleton={}, source_hash=digest,
                       path=problem.path, kernelbench=kb)


def load_tasks(folder: str, evaluator, levels: Sequence[int] = (), ids: Sequence[str] = (), split: str = "",
               overrides: Mapping[tuple[int, str], Mapping[str, int]] | None = None,
               tolerance: float = KERNELBENCH_TOLERANCE) -> tuple[list[task_lib.Task], dict[str, str]]:
  """(tasks, skipped) for the problems of `folder` selected by levels, ids and split (see the docstring)."""
  problems, skipped = problems_lib.find_problems(folder, levels, ids, split)
  checks = [sizes_lib.check_sizes(p.constants, p.level, p.name, overrides) for p in problems]
  kbs = [{"source": p.source, "forward_args": list(p.forward_args)} for p in problems]
  futures = [evaluator.run_job(jobs.RUNNER, jobs.payload(kb, check, LOAD_SEED, kb_trials=1, extra_trials=0),
                               LOAD_TIMEOUT_S) for kb, check in zip(kbs, checks)]
  tasks = []
  for problem, check, future in zip(problems, checks, futures):
    outcome = future.result()
    run = jobs.ReferenceRun(error=outcome.infra_error) if outcome.infra_error else jobs.read(
        outcome.steps.get(jobs.RUNNER), 1)
    if run.error is not None or run.problem is None:
      skipped[problem.id] = run.error or "the reference sent no description"
      continue
    tasks.append(make_task(problem, run.problem, check, tolerance))
  return tasks, skipped
