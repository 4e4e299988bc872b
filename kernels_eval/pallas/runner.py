"""Worker-side Pallas runner (imports JAX; only ever loaded inside a worker).

Inside one sandboxed child, in this order:
  1. the task's reference on every trial's inputs, sent to the parent before any candidate code loads;
  2. `lock_down`, then the candidate executed in a namespace whose imports are views of the allowed
     modules; its `pl.pallas_call` is wrapped so the harness chooses the mode: `interpret=True` for CPU
     runs, `compiler_params=pallas.triton.CompilerParams(...)` (the Triton lowering) otherwise;
  3. stage compile: trace to a jaxpr and check its structure (`structure.check_jaxpr`);
  4. stage lower: `jax.jit(solution).trace(*args).lower(lowering_platforms=("cuda",))` for every
     distinct check shape, with the Triton lowering (runs on CPU with the CUDA plugin installed);
  5. stage correctness: one output per trial, sent to the parent, which compares (the child never sees
     a verdict); interpret mode on CPU, compiled Triton kernels on a GPU;
  6. stage timing (GPU, stages="full" only): the structure check also at the timing sizes, the first
     timed output sent for the parent to compare with the reference (computed in step 1), then median
     kernel and reference times, interleaved, with inputs rotated across the sets. Interpret mode is
     never timed.
"""
from __future__ import annotations

import builtins
import functools
import math
import statistics
import time
import types
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from kernels_eval import reference_runner
from kernels_eval import sandbox
from kernels_eval import static_check
from kernels_eval.pallas import structure

TIMING_WARMUP = 3
TIMING_REPS = 20
_REMOVED_BUILTINS = static_check.FORBIDDEN_NAMES | {"__import__"}
_HIDDEN_MODULES = ("jax.version", "jax.interpreters", "jax.extend", "jax.experimental.compilation_cache")


class _Mode:
  """Which pallas_call lowering the wrapped `pallas_call` selects: 'interpret' or 'triton'."""

  def __init__(self):
    self.value = "interpret"


class _ModuleView(types.ModuleType):
  """Read-only view of a module with some attributes replaced and no private names.

  Submodules are returned as views too, and modules outside JAX (e.g. `jax.version.os`) not at all, so
  no attribute chain leads from an allowed import to `os`, `sys` or `subprocess`.
  """

  def __init__(self, real: types.ModuleType, overrides: dict[str, Any] | None = None):
    super().__init__(real.__name__)
    object.__setattr__(self, "_real", real)
    object.__setattr__(self, "_overrides", overrides or {})

  def __getattr__(self, name: str) -> Any:
    if name in self._overrides:
      return self._overrides[name]
    if name.startswith("_") or name in static_check.FORBIDDEN_ATTRS:
      raise AttributeError(name)
    value = getattr(self._real, name)
    if isinstance(value, types.ModuleType):
      if not value.__name__.startswith("jax.") or value.__name__.startswith(_HIDDEN_MODULES):
        raise AttributeError(f"{self._real.__name__}.{name} is not available to kernel code")
      return _ModuleView(value)
    return value

  def __setattr__(self, name: str, value: Any) -> None:
    raise AttributeError(f"module {self._real.__name__} is read-only")


def _wrapped_pallas_call(mode: _Mode) -> Callable[..., Any]:
  def pallas_call(kernel, *args, **kwargs):
    for name in static_check.HARNESS_KWARGS:
      if name in kwargs:
        raise ValueError(f"do not pass `{name}=` to pallas_call: the harness selects the backend")
    params = kwargs.get("compiler_params")
    if params is not None and not isinstance(params, pl_triton.CompilerParams):
      raise ValueError("compiler_params must be jax.experimental.pallas.triton.CompilerParams(...)")
    if mode.value == "interpret":
      kwargs["interpret"] = True
    elif params is None:
      kwargs["compiler_params"] = pl_triton.CompilerParams()
    return pl.pallas_call(kernel, *args, **kwargs)
  return pallas_call


def _modules(mode: _Mode) -> dict[str, types.ModuleType]:
  triton_view = _ModuleView(pl_triton)
  pallas_view = _ModuleView(pl, {"pallas_call": _wrapped_pallas_call(mode), "triton": triton_view})
  experimental_view = _ModuleView(jax.experimental, {"pallas": pallas_view})
  numpy_view, lax_view = _ModuleView(jnp), _ModuleView(lax)
  jax_view = _ModuleView(jax, {"experimental": experimental_view, "numpy": numpy_view, "lax": lax_view})
  return {"jax": jax_view, "jax.numpy": numpy_view, "jax.lax": lax_view, "jax.experimental": experimental_view,
          "jax.experimental.pallas": pallas_view, "jax.experimental.pallas.triton": triton_view,
          "functools": functools, "math": math}


def load_candidate(source: str, mode: _Mode) -> Callable[..., Any]:
  """Executes the candidate in a fresh namespace and returns its `solution`."""
  modules = _modules(mode)

  def guarded_import(name, globals_=None, locals_=None, fromlist=(), level=0):
    if isinstance(fromlist, list) and fromlist in ([], ["__doc__"]) and not level:
      # PyImport_Import (C code such as numpy's dtype conversion) passes a list; `import` statements
      # pass None or a tuple, and calling `__import__` by name is rejected by the static check.
      return builtins.__import__(name, globals_, locals_, fromlist, level)
    if level or name not in modules:
      raise ImportError(f"import of {name!r} is not allowed")
    del globals_, locals_
    return modules[name] if fromlist else modules[name.split(".")[0]]

  safe_builtins = {k: v for k, v in vars(builtins).items() if k not in _REMOVED_BUILTINS}
  safe_builtins["__import__"] = guarded_import
  namespace = {"__builtins__": safe_builtins, "__name__": "solution"}
  exec(compile(source, "solution.py", "exec"), namespace)  # pylint: disable=exec-used
  fn = namespace.get("solution")
  if not callable(fn):
    raise TypeError("the source must define a callable `solution`")
  return fn


def _trim_error(e: BaseException, source: str) -> str:
  """The exception message plus the candidate's own frames (solution.py), most useful lines first."""
  import traceback  # pylint: disable=import-outside-toplevel
  frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == "solution.py"]
  msg = f"{type(e).__name__}: {e}".strip()
  lines = [ln for ln in msg.splitlines() if ln.strip()]
  if len(lines) > 14:
    lines = lines[:10] + ["..."] + lines[-3:]
  src = source.splitlines()
  where = "".join(f"  solution.py line {f.lineno}: {src[f.lineno - 1].strip() if 0 < f.lineno <= len(src) else ''}\n"
                  for f in frames[-3:])
  return ("\n".join(lines) + ("\n" + where if where else "")).strip()


def _structs(trials: list[list[np.ndarray]]) -> list[list[jax.ShapeDtypeStruct]]:
  seen, out = set(), []
  for inputs in trials:
    key = tuple((x.shape, x.dtype.name) for x in inputs)
    if key not in seen:
      seen.add(key)
      out.append([jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs])
  return out


def _median_ms(fn: Callable[..., Any], args_sets: list[list[jax.Array]], ref: Callable[..., Any]) -> tuple[
    float, float]:
  for args in args_sets[:TIMING_WARMUP]:
    jax.block_until_ready(fn(*args))
    jax.block_until_ready(ref(*args))
  kernel_ms, ref_ms = [], []
  for rep in range(TIMING_REPS):
    args = args_sets[rep % len(args_sets)]
    for f, acc in ((fn, kernel_ms), (ref, ref_ms)) if rep % 2 == 0 else ((ref, ref_ms), (fn, kernel_ms)):
      t0 = time.perf_counter()
      jax.block_until_ready(f(*args))
      acc.append((time.perf_counter() - t0) * 1e3)
  return statistics.median(kernel_ms), statistics.median(ref_ms)


def run(payload: dict[str, Any], emit: Callable[[dict[str, Any]], None], tmpdir: str) -> None:
  durations: dict[str, float] = {}
  platform = jax.default_backend()
  emit({"kind": "env", "platform": platform})
  trials = payload["trials"]
  t0 = time.monotonic()
  try:
    ref_fn = reference_runner.load_reference(payload["task"])
    emit({"kind": "reference", "outputs": reference_runner.compute(ref_fn, trials)})
    timing_sets = payload.get("timing_trials") if platform == "gpu" and payload["stages"] == "full" else None
    if timing_sets:
      emit({"kind": "timing_reference", "output": reference_runner.compute(ref_fn, timing_sets[:1])[0]})
  except Exception as e:  # noqa: BLE001
    emit({"kind": "reference_error", "feedback": sandbox.format_exception(e)})
    return
  durations["reference"] = time.monotonic() - t0

  sandbox.lock_down(tmpdir)
  mode = _Mode()
  emit({"kind": "stage", "stage": "compile"})
  t0 = time.monotonic()
  try:
    fn = load_candidate(payload["source"], mode)
    structs = _structs(trials)
    checked = structs + (_structs(timing_sets[:1]) if timing_sets else [])
    closed = [jax.make_jaxpr(fn)(*args) for args in checked]
  except Exception as e:  # noqa: BLE001
    emit({"kind": "error", "stage": "compile", "status": "compile_error",
          "feedback": _trim_error(e, payload["source"])})
    return
  for args, jaxpr in zip(checked, closed):
    problem = structure.check_jaxpr(jaxpr)
    if problem is not None:
      shapes = ", ".join(f"{list(a.shape)}" for a in args)
      emit({"kind": "error", "stage": "compile", "status": "compile_error", "rejected_reason": problem[0],
            "feedback": f"{problem[1]} (input shapes {shapes})"})
      return
  durations["compile"] = time.monotonic() - t0

  emit({"kind": "stage", "stage": "lower"})
  t0 = time.monotonic()
  mode.value = "triton"
  jax.clear_caches()
  for args in structs:
    try:
      jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    except Exception as e:  # noqa: BLE001
      shapes = ", ".join(f"{list(a.shape)}" for a in args)
      emit({"kind": "error", "stage": "lower", "status": "compile_error",
            "feedback": f"Triton lowering failed for input shapes {shapes}:\n{_trim_error(e, payload['source'])}"})
      return
  durations["lower"] = time.monotonic() - t0
  if payload["stages"] == "compile":
    emit({"kind": "done", "durations": durations})
    return

  emit({"kind": "stage", "stage": "correctness"})
  t0 = time.monotonic()
  on_gpu = platform == "gpu"
  mode.value = "triton" if on_gpu else "interpret"
  jax.clear_caches()
  jitted = jax.jit(fn)
  for t, inputs in enumerate(trials):
    try:
      args = [jnp.asarray(x) for x in inputs]
      out = np.asarray(jax.block_until_ready(jitted(*args)))
    except Exception as e:  # noqa: BLE001
      emit({"kind": "error", "stage": "correctness", "status": "runtime_error", "trial": t,
            "feedback": f"trial {t + 1} of {len(trials)} raised:\n{_trim_error(e, payload['source'])}"})
      return
    emit({"kind": "output", "trial": t, "output": out})
  durations["correctness"] = time.monotonic() - t0

  if timing_sets:
    emit({"kind": "stage", "stage": "timing"})
    t0 = time.monotonic()
    device_sets = [[jnp.asarray(x) for x in inputs] for inputs in timing_sets]
    timed = jax.jit(fn)
    try:
      emit({"kind": "timing_output", "output": np.asarray(jax.block_until_ready(timed(*device_sets[0])))})
      kernel_ms, ref_ms = _median_ms(timed, device_sets, jax.jit(ref_fn))
    except Exception as e:  # noqa: BLE001
      emit({"kind": "error", "stage": "timing", "status": "runtime_error",
            "feedback": f"at the timing sizes:\n{_trim_error(e, payload['source'])}"})
      return
    emit({"kind": "timing", "kernel_ms": kernel_ms, "reference_ms": ref_ms})
    durations["timing"] = time.monotonic() - t0
  emit({"kind": "done", "durations": durations})
