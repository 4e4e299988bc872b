"""Worker-side: runs a task's `reference` (imports JAX; only ever loaded inside a worker).

`run` is the runner of `validate_task`: it computes the reference on every trial's inputs, then once
more on the first trial's inputs (determinism), and, for each input in turn, on the first trial's
inputs with that one input redrawn (an output that ignores an input is degenerate).
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from kernels_eval import sandbox


def load_reference(task_job: dict[str, Any]) -> Callable[..., Any]:
  namespace = {"jax": jax, "jnp": jnp, "lax": lax, "math": math}
  code = compile(task_job["reference_source"], "reference.py", "exec")
  exec(code, namespace)  # pylint: disable=exec-used
  return namespace["reference"]


def compute(fn: Callable[..., Any], trials: list[list[np.ndarray]]) -> list[np.ndarray]:
  """Reference outputs (numpy) for each trial's inputs; one jit shared by all trials."""
  jitted = jax.jit(fn)
  outs = []
  for inputs in trials:
    out = jitted(*[jnp.asarray(x) for x in inputs])
    if not isinstance(out, jax.Array):
      raise TypeError(f"reference must return one array, got {type(out).__name__}")
    outs.append(np.asarray(out))
  return outs


def run(payload: dict[str, Any], emit: Callable[[dict[str, Any]], None], tmpdir: str) -> None:
  sandbox.lock_down(tmpdir)
  start = time.monotonic()
  try:
    fn = load_reference(payload["task"])
    outs = compute(fn, payload["trials"])
    emit({"kind": "reference", "outputs": outs})
    emit({"kind": "repeat", "outputs": compute(fn, payload["trials"][:1])})
    emit({"kind": "perturbed", "outputs": compute(fn, payload.get("perturbed", []))})
  except Exception as e:  # noqa: BLE001  (any failure of the reference is the task's)
    emit({"kind": "error", "stage": "correctness", "status": "runtime_error",
          "feedback": sandbox.format_exception(e)})
    return
  emit({"kind": "done", "durations": {"reference": time.monotonic() - start},
        "platform": jax.default_backend()})
