"""Worker-side: runs a task's `reference` (imports JAX; only ever loaded inside a worker).

Two runners, each the only code of its sandboxed child (no candidate code ever runs next to them):
  `run`       the reference step of an evaluation: outputs for every trial and, when the job times a
              GPU run, the output for the first timing set and the reference's device time over all the
              sets (`timing.measure`, the method every candidate is timed with, under
              `gpu_lock.exclusive`); matmuls at "highest" precision, so TF32 cannot blur a verdict.
              Frames: env, reference,
              [timing_reference{output, reference_ms}], done (or reference_error).
  `validate`  the runner of `validate_task`: every trial's outputs, once more on the first trial's inputs
              (determinism), and, for each input in turn, on the first trial's inputs with that one
              input redrawn (an output that ignores an input is degenerate).
A task's reference is untrusted when the task was generated: the audit hook is installed before it loads.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from kernels_eval import gpu_lock
from kernels_eval import sandbox
from kernels_eval import timing


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


def _platform() -> str:
  return "gpu" if jax.default_backend() in ("gpu", "cuda", "rocm") else "cpu"


def run(payload: dict[str, Any], emit: Callable[[dict[str, Any]], None], tmpdir: str) -> None:
  start = time.monotonic()
  platform = _platform()
  emit({"kind": "env", "platform": platform})
  timing_sets = payload.get("timing_trials") if payload["stages"] == "full" else None
  sandbox.lock_down(tmpdir)
  try:
    with jax.default_matmul_precision("highest"):
      fn = load_reference(payload["task"])
      with gpu_lock.shared():
        emit({"kind": "reference", "outputs": compute(fn, payload["trials"])})
      if timing_sets:
        device_sets = [[jnp.asarray(x) for x in inputs] for inputs in timing_sets]
        with gpu_lock.exclusive():
          measured = timing.measure(jax.jit(fn), device_sets)
        emit({"kind": "timing_reference", "output": np.asarray(measured.output), "reference_ms": measured.ms,
              "samples": list(measured.samples)})
  except Exception as e:  # noqa: BLE001  (any failure of the reference is the task's)
    emit({"kind": "reference_error", "feedback": sandbox.format_exception(e)})
    return
  emit({"kind": "done", "durations": {"reference": time.monotonic() - start}})


def validate(payload: dict[str, Any], emit: Callable[[dict[str, Any]], None], tmpdir: str) -> None:
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
  emit({"kind": "done", "durations": {"reference": time.monotonic() - start}, "platform": _platform()})
