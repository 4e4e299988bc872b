"""Worker-side Pallas runner: the candidate step of a job (imports JAX; only ever loaded inside a worker).

Inside one sandboxed child (the reference was computed by another), in this order:
  1. `lock_down`, then the candidate executed in a namespace whose imports are views of the allowed
     modules; its `pl.pallas_call` is wrapped so that every kernel gets the Triton lowering
     (`compiler_params=pallas.triton.CompilerParams(...)`) and no harness option;
  2. stage compile: `jax.jit(solution).trace(*shapes)` once per distinct input shape — the only time any
     candidate Python runs — and the structure check of that very jaxpr (`structure.check_jaxpr`);
  3. stage lower: that traced computation lowered for CUDA (Triton), which runs on CPU with the CUDA plugin;
  4. stage correctness: the same traced computation compiled and called for every trial; on CPU its
     pallas_calls are switched to the Pallas interpreter in the jaxpr itself (`structure.interpreted`), on a
     GPU the Triton lowering of step 3 is compiled. One output per trial goes to the parent, which compares
     (the child never sees a verdict);
  5. stage timing (GPU, stages="full" only): the computation traced, checked and compiled at the timing
     sizes and timed on the device (`timing.measure`: warm-up, L2 flushed, fresh inputs, dispatch cost
     cancelled) while no other job uses the GPU (`gpu_lock.exclusive`); the output of its last timed call,
     on the first timing set, goes to the parent to compare. The reference's time comes from the reference
     step, timed the same way. Steps 3-4 hold the GPU lock shared.
A candidate that behaves differently from one trace to the next gains nothing: there is one trace per
shape, and what it produced is exactly what is checked, lowered and run.
"""
from __future__ import annotations

import builtins
import functools
import math
import time
import types
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

import jax.extend.core as jex_core

from kernels_eval import sandbox
from kernels_eval import static_check
from kernels_eval import gpu_lock
from kernels_eval import timing
from kernels_eval.pallas import structure

class _ModuleView(types.ModuleType):
  """Read-only view of a module that offers exactly its allowlist (`static_check.MODULE_ATTRIBUTES`).

  Allowed submodules are views too, so no attribute chain leads from an import to `os`, `sys`,
  callbacks or the harness's own modules, whatever the static check missed.
  """

  def __init__(self, real: types.ModuleType, overrides: dict[str, Any] | None = None):
    super().__init__(real.__name__)
    object.__setattr__(self, "_real", real)
    object.__setattr__(self, "_overrides", overrides or {})
    object.__setattr__(self, "_allowed", static_check.MODULE_ATTRIBUTES.get(real.__name__, frozenset()))

  def __getattr__(self, name: str) -> Any:
    if name in self._overrides:
      return self._overrides[name]
    if name not in self._allowed:
      raise AttributeError(f"{self._real.__name__}.{name} is not available to kernel code")
    value = getattr(self._real, name)
    if isinstance(value, types.ModuleType):
      if value.__name__ not in static_check.MODULE_ATTRIBUTES:
        raise AttributeError(f"{self._real.__name__}.{name} is not available to kernel code")
      return _ModuleView(value)
    return value

  def __setattr__(self, name: str, value: Any) -> None:
    raise AttributeError(f"module {self._real.__name__} is read-only")


def _pallas_call(kernel, *args, **kwargs):
  """`pl.pallas_call` as candidates see it: always the Triton lowering, never a harness option."""
  for name in static_check.HARNESS_KWARGS:
    if name in kwargs:
      raise ValueError(f"do not pass `{name}=` to pallas_call: the harness selects the backend")
  params = kwargs.get("compiler_params")
  if params is not None and not isinstance(params, pl_triton.CompilerParams):
    raise ValueError("compiler_params must be jax.experimental.pallas.triton.CompilerParams(...)")
  if params is None:
    kwargs["compiler_params"] = pl_triton.CompilerParams()
  return pl.pallas_call(kernel, *args, **kwargs)


def _modules() -> dict[str, types.ModuleType]:
  triton_view = _ModuleView(pl_triton)
  pallas_view = _ModuleView(pl, {"pallas_call": _pallas_call, "triton": triton_view})
  experimental_view = _ModuleView(jax.experimental, {"pallas": pallas_view})
  numpy_view, lax_view = _ModuleView(jnp), _ModuleView(lax)
  jax_view = _ModuleView(jax, {"experimental": experimental_view, "numpy": numpy_view, "lax": lax_view})
  return {"jax": jax_view, "jax.numpy": numpy_view, "jax.lax": lax_view, "jax.experimental": experimental_view,
          "jax.experimental.pallas": pallas_view, "jax.experimental.pallas.triton": triton_view,
          "functools": _ModuleView(functools), "math": _ModuleView(math)}


def load_candidate(source: str) -> Callable[..., Any]:
  """Executes the candidate in a fresh namespace and returns its `solution`."""
  modules = _modules()

  def guarded_import(name, globals_=None, locals_=None, fromlist=(), level=0):
    if isinstance(fromlist, list) and fromlist in ([], ["__doc__"]) and not level:
      # PyImport_Import (C code such as numpy's dtype conversion) passes a list; `import` statements
      # pass None or a tuple, and calling `__import__` by name is rejected by the static check.
      return builtins.__import__(name, globals_, locals_, fromlist, level)
    if level or name not in modules:
      raise ImportError(f"import of {name!r} is not allowed")
    del globals_, locals_
    return modules[name] if fromlist else modules[name.split(".")[0]]

  safe_builtins = {k: v for k, v in vars(builtins).items() if k in static_check.ALLOWED_BUILTINS}
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


def _shape_key(inputs: list[np.ndarray]) -> tuple:
  return tuple((x.shape, x.dtype.name) for x in inputs)


def _error(emit, stage: str, status: str, feedback: str, reason: str | None = None) -> None:
  msg = {"kind": "error", "stage": stage, "status": status, "feedback": feedback}
  if reason:
    msg["rejected_reason"] = reason
  emit(msg)


def _shapes_text(traced) -> str:
  return ", ".join(f"{list(v.aval.shape)}" for v in traced.jaxpr.jaxpr.invars)


def trace_and_check(fn: Callable[..., Any], input_sets: list[list[np.ndarray]], source: str,
                    emit) -> dict[tuple, Any] | None:
  """One `jax.jit(fn).trace` per distinct input shape, each structure-checked; None after an error frame."""
  traced = {}
  for inputs in input_sets:
    key = _shape_key(inputs)
    if key in traced:
      continue
    try:
      traced[key] = jax.jit(fn).trace(*[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs])
    except Exception as e:  # noqa: BLE001
      _error(emit, "compile", "compile_error", _trim_error(e, source))
      return None
    problem = structure.check_jaxpr(traced[key].jaxpr)
    if problem is not None:
      _error(emit, "compile", "compile_error", f"{problem[1]} (input shapes {_shapes_text(traced[key])})",
             problem[0])
      return None
  return traced


def _executable(traced, on_gpu: bool):
  """The traced computation compiled: its Triton lowering on a GPU, the Pallas interpreter on CPU."""
  if on_gpu:
    return traced.lower().compile()
  closed = structure.interpreted(traced.jaxpr)
  structs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]
  compiled = jax.jit(jex_core.jaxpr_as_fun(closed)).trace(*structs).lower().compile()
  return lambda *args: compiled(*args)[0]


def _triton_target_without_gpu() -> None:
  """JAX 0.11's Triton rule asks the default device for its compute capability and raises on a CPU-only host
  ("No supported GPU devices found"); 0.10 fell back to CC 9.0. Restore that fallback for the "cpu" device
  kind only (a GPU host's own device kind still wins). No-op on JAX 0.10, which has no `gpu_info`."""
  try:
    from jax._src.pallas.triton import gpu_info
  except ImportError:
    return
  gpu_info.registry.setdefault("cpu", lambda: gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion.H100))


_triton_target_without_gpu()


def _lower_for_triton(traced: dict[tuple, Any], source: str, emit) -> bool:
  for t in traced.values():
    try:
      t.lower(lowering_platforms=("cuda",))
    except Exception as e:  # noqa: BLE001
      _error(emit, "lower", "compile_error", f"Triton lowering failed for input shapes {_shapes_text(t)}:\n"
             f"{_trim_error(e, source)}")
      return False
  return True


def _correctness(traced: dict[tuple, Any], trials: list, on_gpu: bool, source: str, emit) -> bool:
  executables = {}
  for t, inputs in enumerate(trials):
    key = _shape_key(inputs)
    try:
      if key not in executables:
        executables[key] = _executable(traced[key], on_gpu)
      out = np.asarray(jax.block_until_ready(executables[key](*[jnp.asarray(x) for x in inputs])))
    except Exception as e:  # noqa: BLE001
      _error(emit, "correctness", "runtime_error", f"trial {t + 1} of {len(trials)} raised:\n{_trim_error(e, source)}")
      return False
    emit({"kind": "output", "trial": t, "output": out})
  return True


def _timed(fn: Callable[..., Any], timing_sets: list, on_gpu: bool, source: str, emit) -> bool:
  traced = trace_and_check(fn, timing_sets[:1], source, emit)
  if traced is None:
    return False
  try:
    run = _executable(next(iter(traced.values())), on_gpu)
    device_sets = [[jnp.asarray(x) for x in inputs] for inputs in timing_sets]
    with gpu_lock.exclusive():
      measured = timing.measure(run, device_sets)
  except Exception as e:  # noqa: BLE001
    _error(emit, "timing", "runtime_error", f"at the timing sizes:\n{_trim_error(e, source)}")
    return False
  emit({"kind": "timing_output", "output": np.asarray(measured.output)})
  emit({"kind": "timing", "kernel_ms": measured.ms, "flags": [], "samples": {"kernel_ms": list(measured.samples)}})
  return True


def run(payload: dict[str, Any], emit: Callable[[dict[str, Any]], None], tmpdir: str) -> None:
  durations: dict[str, float] = {}
  on_gpu = jax.default_backend() == "gpu"
  emit({"kind": "env", "platform": "gpu" if on_gpu else "cpu"})
  trials = payload["trials"]
  timing_sets = payload.get("timing_trials") if payload["stages"] == "full" else None
  sandbox.lock_down(tmpdir)
  emit({"kind": "stage", "stage": "compile"})
  t0 = time.monotonic()
  try:
    fn = load_candidate(payload["source"])
  except Exception as e:  # noqa: BLE001
    _error(emit, "compile", "compile_error", _trim_error(e, payload["source"]))
    return
  traced = trace_and_check(fn, trials, payload["source"], emit)
  if traced is None:
    return
  durations["compile"] = time.monotonic() - t0
  emit({"kind": "stage", "stage": "lower"})
  t0 = time.monotonic()
  if not _lower_for_triton(traced, payload["source"], emit):
    return
  durations["lower"] = time.monotonic() - t0
  if payload["stages"] != "compile":
    emit({"kind": "stage", "stage": "correctness"})
    t0 = time.monotonic()
    with gpu_lock.shared():
      if not _correctness(traced, trials, on_gpu, payload["source"], emit):
        return
    durations["correctness"] = time.monotonic() - t0
    if timing_sets:
      emit({"kind": "stage", "stage": "timing"})
      t0 = time.monotonic()
      if not _timed(fn, timing_sets, on_gpu, payload["source"], emit):
        return
      durations["timing"] = time.monotonic() - t0
  emit({"kind": "done", "durations": durations})
