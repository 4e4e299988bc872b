"""The record of one adversarial candidate in the hardening corpus.

Each case names the stage that must catch it and the verdict expected there:

  stage     "static"       the language's source rules (parent, before compiling)
            "compile"      compilation (nvcc) or tracing and the structure check (Pallas)
            "audit"        the symbol audit of a compiled CUDA library
            "lower"        the Triton lowering of a Pallas kernel
            "correctness"  running the trials: output comparison and harness observations
            "timing"       the timed runs (re-check of a timed output, speedup flags)
            "sanitizer"    the GPU run under compute-sanitizer (`KERNELS_EVAL_CUDA_SANITIZER=1`)
  needs_gpu the catching stage runs only on a GPU host (CUDA correctness, sanitizer)
  status / reason / flag   the expected `EvalResult.status`, `rejected_reason` (None: none required)
            and a flag that must be present (None: none required); `result_stage`, when set, the
            expected `EvalResult.stage`; `feedback_has`, when set, a phrase the feedback must contain
            (an escaped case that raises for another reason than "blocked" proves nothing).

A case that needs a GPU counts on a CPU host only if it passed every earlier stage (status `not_run`
at stage `compile`, no rejected_reason): it must not be stopped early for the wrong reason, and it must
never come out `correct`.
"""
from __future__ import annotations

import dataclasses

CASE_STAGES = ("static", "compile", "audit", "lower", "correctness", "timing", "sanitizer")


@dataclasses.dataclass(frozen=True)
class Case:
  """task_id: an embedded task, or the ID of `task_source` when the case brings its own task."""
  name: str
  lang: str
  task_id: str
  attack: str
  stage: str
  status: str
  reason: str | None
  flag: str | None
  source: str
  needs_gpu: bool = False
  result_stage: str | None = None
  task_source: str | None = None
  timeout_s: float | None = None
  feedback_has: str | None = None

  def __post_init__(self):
    if self.stage not in CASE_STAGES:
      raise ValueError(f"hardening case {self.name}: stage {self.stage!r} is not one of {CASE_STAGES}")
