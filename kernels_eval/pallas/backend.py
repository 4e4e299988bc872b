"""Parent-side half of the Pallas backend (no JAX): static check and contract text."""
from __future__ import annotations

from kernels_eval import backends
from kernels_eval import render
from kernels_eval import static_check
from kernels_eval import task as task_lib


def _static_check(task: task_lib.Task, source: str) -> static_check.Rejection | None:
  return static_check.check_pallas_candidate(source, task.input_names)


BACKEND = backends.Backend(lang="pallas", fence_tags=("python", "py", "python3", ""),
                           static_check=_static_check, contract=render.pallas_contract,
                           runner="kernels_eval.pallas.runner:run", timeout_s=120.0)
