"""Language backends: how a language plugs into the evaluator without touching its core.

A `Backend` has a parent side (no JAX, no candidate code runs) and a worker side:

  lang          "pallas", "cuda", ...; also the `lang` of `EvalResult`.
  fence_tags    code-fence tags `extract_code` accepts for this language ("" = a bare fence).
  static_check  `(task, source) -> static_check.Rejection | None`, in the parent.
  contract      `(task) -> str`: the exact kernel contract `render_task` shows (signature, rules).
  runner        "module:function" imported once by each worker; `function(payload, emit, tmpdir)` runs
                the candidate step of a job in a fresh sandboxed child (see `kernels_eval.sandbox`); the
                reference step before it runs `kernels_eval.reference_runner:run` in another child.
  timeout_s     default wall limit of one job (reference + every stage), in seconds.

The payload both steps get: `task` (`Task.to_job()`: reference source, input names, hash), `source`,
`stages` ("compile", "correctness" or "full"), `trials` (one list of numpy inputs per trial),
`trial_dims` (the DIMS entry of each trial), `timing_trials` and `timing_dims` (GPU hosts, "full" only),
`input_dtypes`.

What a candidate runner emits (`emit(dict)`), in the order `kernels_eval.protocol` accepts:
  {"kind": "env", "platform": "cpu" | "gpu"}                 optional, first
  {"kind": "stage", "stage": "compile"}                      BEFORE any candidate code is loaded
  {"kind": "stage", "stage": s}                              entering stage s (lower, correctness, timing)
  {"kind": "error", "stage": s, "status": "compile_error" | "runtime_error" | "wrong_output" | "timeout",
   "feedback": str, "rejected_reason": str (optional)}       then stop
  {"kind": "output", "trial": t, "output": array}            one per trial, in order; compared in the parent
  {"kind": "not_run", "feedback": str}                       passed what can run here (no GPU), then done
  {"kind": "timing_output", "output": array}                 GPU: the output of a timed call on the first
  {"kind": "timing", "kernel_ms": float, "reference_ms": float, "flags": [str]}   timing set, then its times
  {"kind": "done", "durations": {stage: seconds}}
A runner calls `sandbox.lock_down(tmpdir)` before loading the candidate. Stages are those of
`schema.STAGES`.

Registering: `register(Backend(...))`. The built-in table below names each language's backend as
"module:attribute"; it is imported on first use, so a backend's module only has to exist.
"""
from __future__ import annotations

import dataclasses
import importlib
import threading
from typing import Callable

from kernels_eval import static_check
from kernels_eval import task as task_lib


@dataclasses.dataclass(frozen=True)
class Backend:
  lang: str
  fence_tags: tuple[str, ...]
  static_check: Callable[[task_lib.Task, str], static_check.Rejection | None]
  contract: Callable[[task_lib.Task], str]
  runner: str
  timeout_s: float = 120.0


BUILTIN = {"pallas": "kernels_eval.pallas.backend:BACKEND", "cuda": "kernels_eval.cuda.backend:BACKEND"}
_registry: dict[str, Backend] = {}
_lock = threading.Lock()


def register(backend: Backend) -> None:
  with _lock:
    _registry[backend.lang] = backend


def unregister(lang: str) -> None:
  with _lock:
    _registry.pop(lang, None)


def get(lang: str) -> Backend:
  """The backend of `lang`; raises ValueError naming the language when there is none."""
  with _lock:
    if lang in _registry:
      return _registry[lang]
  if lang not in BUILTIN:
    raise ValueError(f"unknown language {lang!r}; known: {sorted(set(BUILTIN) | set(_registry))}")
  module, _, attr = BUILTIN[lang].partition(":")
  try:
    backend = getattr(importlib.import_module(module), attr)
  except Exception as e:  # noqa: BLE001  (a missing or broken backend must not break the others)
    raise ValueError(f"language {lang!r} has no usable backend ({BUILTIN[lang]}: {e!r})") from e
  register(backend)
  return backend


def runners() -> dict[str, str]:
  """name -> "module:function" of every backend that can be loaded, plus the reference runner."""
  out = {"reference": "kernels_eval.reference_runner:run", "validate": "kernels_eval.reference_runner:validate",
         "kernelbench_reference": "kernels_eval.kernelbench.reference:run",
         "kernelbench_cuda": "kernels_eval.kernelbench.cuda_runner:run"}
  for lang in sorted(set(BUILTIN) | set(_registry)):
    try:
      out[lang] = get(lang).runner
    except ValueError:
      continue
  return out
