"""Worker side of the CUDA backend: the runner `kernels_eval.cuda.gpu_job:run` (protocol: `backends`).

The candidate step of a CUDA job. It runs in a sandboxed child that imported JAX but never loads
candidate code itself: the candidate library is loaded only by the harness program (`runner.cu`), a
grandchild inside the same jail. The reference was computed (and timed) by the job's reference step,
in another process. Steps:

  1. stage compile: the library from the compile cache, which the parent filled while checking the
     request (`backend.static_check`); the child only reads the cache, and compiles privately on a miss;
     then the symbol audit again;
  2. no GPU: `not_run` (never `correct`);
  3. stage correctness: per distinct check-dims entry one harness process runs `check`, holding the GPU
     lock shared (`kernels_eval.gpu_lock`); outputs go to the parent, which compares them with the
     reference. Harness findings end the run with an error: no kernel launched, a launch on another
     stream, a modified input, trial 0 not reproducible;
  4. stage timing (stages="full"): one harness process runs `time` at the timing dims, holding the GPU lock
     exclusive (taken after every shared hold is released), with the evaluator's one timing method
     (`kernels_eval.timing`, implemented for CUDA in `runner.cu`): after TIMING_WARMUP calls, per round the
     device time of N x [prep(i); call(i)] minus that of N x [prep(i)], over N, where prep(i) restores set
     i's inputs from pristine device copies, poisons the output and flushes L2; sets rotate and the last
     call is on set 0, whose output goes to the parent to be compared with the reference. kernel_ms is the
     median over TIMING_ROUNDS rounds (every round is kept as a sample); a flag for beating the memory
     roofline (the core flags speedups above 10x).
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable

import jax
import numpy as np

from kernels_eval import gpu_lock
from kernels_eval import reference_runner
from kernels_eval import task as task_lib
from kernels_eval import timing
from kernels_eval.cuda import audit as audit_lib
from kernels_eval.cuda import compile as compile_lib
from kernels_eval.cuda import prototype as prototype_lib
from kernels_eval.cuda import session as session_lib
from kernels_eval.cuda import toolchain as toolchain_lib
from kernels_eval.cuda import verdict as verdict_lib

TIMING_ROUNDS, TIMING_CALLS, TIMING_WARMUP = timing.ROUNDS, timing.CALLS, timing.WARMUP  # the JAX paths' own
CHECK_TIMEOUT_S = float(os.environ.get("KERNELS_EVAL_CUDA_CHECK_TIMEOUT_S", "60"))  # per harness `check`
TIME_TIMEOUT_S = 120.0
SANITIZER_ENV = "KERNELS_EVAL_CUDA_SANITIZER"  # "1": run the correctness trials under compute-sanitizer


def signature(payload: dict[str, Any]) -> prototype_lib.CudaSignature:
  """The launch-function signature from a job payload (dims in DIMS["timing"] order)."""
  task = payload["task"]
  dim_names = task.get("dim_names") or list(payload.get("timing_dims") or payload["trial_dims"][0])
  dtypes = tuple(payload["input_dtypes"])
  return prototype_lib.CudaSignature(tuple(task["input_names"]), dtypes, dtypes[0], tuple(dim_names))


def dims_groups(trial_dims: list[dict[str, int]]) -> list[list[int]]:
  """Trial ids grouped by equal dims, in order of first appearance (one harness process per group)."""
  groups: dict[tuple, list[int]] = {}
  for t, dims in enumerate(trial_dims):
    groups.setdefault(tuple(sorted(dims.items())), []).append(t)
  return list(groups.values())


def _gpu_visible() -> bool:
  try:
    return any(d.platform == "gpu" for d in jax.devices())
  except RuntimeError:
    return False


def _failure(emit, stage: str, e: session_lib.RunnerFailure, dims: dict[str, int]) -> None:
  sizes = ", ".join(f"{k}={v}" for k, v in dims.items())
  if e.kind == "no_device":
    emit({"kind": "not_run", "stage": "compile", "feedback": f"not_run: no usable GPU for the CUDA 13 runtime "
          f"({e.message}; CUDA 13 needs an NVIDIA driver >= 580)"})
    emit({"kind": "done", "durations": {}})
    return
  if e.kind == "timeout":
    status = "timeout"
  else:
    status = "runtime_error"
  msg = {"kind": "error", "stage": stage, "status": status, "feedback": f"{e.kind} ({sizes}): {e.message}"}
  if e.kind == "sanitizer":
    msg["rejected_reason"] = "memory_error"
  emit(msg)


def _out_struct(payload: dict[str, Any], inputs: list[np.ndarray]) -> tuple[tuple[int, ...], np.dtype]:
  """The output's shape and dtype, from the reference traced abstractly (its values come from the
  job's reference step; nothing is computed here)."""
  fn = reference_runner.load_reference(payload["task"])
  out = jax.eval_shape(fn, *[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs])
  return tuple(out.shape), np.dtype(out.dtype)


def calls_per_round(n_sets: int) -> int:
  """N: about TIMING_CALLS, such that the last call (i = N - 1, whose output is re-checked) uses set 0."""
  return n_sets * ((TIMING_CALLS - 1) // n_sets) + 1


def _compile(payload: dict[str, Any], sig: prototype_lib.CudaSignature, tc, tmpdir: str, emit) -> str | None:
  """The audited library (from the cache, or compiled privately); None after an error frame."""
  source = payload["source"]
  compiled = compile_lib.compile_source(source + sig.entry_shim(), toolchain_lib.target_arch(), tc,
                                        prototype=sig.prototype(), private_dir=tmpdir)
  if not compiled.ok:
    emit({"kind": "error", "stage": "compile", "status": "compile_error", "feedback": compiled.feedback})
    return None
  rejection = audit_lib.audit_library(compiled.library, source, ("solution", prototype_lib.ENTRY_SYMBOL))
  if rejection is not None:
    emit({"kind": "error", "stage": "compile", "status": "compile_error", "rejected_reason": rejection.reason,
          "feedback": rejection.feedback()})
    return None
  return compiled.library


def _check(payload, sig, runner, library, sanitizer, emit) -> bool:
  trials = payload["trials"]
  tol = payload.get("tolerance") or task_lib.DEFAULT_TOLERANCE[sig.output_dtype]
  for ids in dims_groups(payload["trial_dims"]):
    dims = payload["trial_dims"][ids[0]]
    shape, dtype = _out_struct(payload, trials[ids[0]])
    with gpu_lock.shared():
      session = session_lib.RunnerSession(runner, library, [trials[t] for t in ids], shape, dtype,
                                          [dims[d] for d in sig.dim_names], sanitizer=sanitizer)
      try:
        reply = session.check(timeout_s=CHECK_TIMEOUT_S)
      except session_lib.RunnerFailure as e:
        _failure(emit, "correctness", e, dims)
        return False
      finally:
        session.close()
    problem = verdict_lib.harness_findings(reply.launches, reply.foreign_streams,
                                           [(ids[t], k) for t, k in reply.mutated], list(sig.input_names))
    if problem is None:
      problem = verdict_lib.determinism(reply.outputs[0], reply.determinism, tol)
    if problem is not None:
      emit({"kind": "error", "stage": "correctness", "status": "wrong_output", "rejected_reason": problem[0],
            "feedback": problem[1]})
      return False
    for t, out in zip(ids, reply.outputs):
      emit({"kind": "output", "trial": t, "output": out})
  return True


def _time(payload, sig, runner, library, emit) -> bool:
  sets, dims = payload["timing_trials"], payload["timing_dims"]
  shape, dtype = _out_struct(payload, sets[0])
  with gpu_lock.exclusive():
    session = session_lib.RunnerSession(runner, library, sets, shape, dtype, [dims[d] for d in sig.dim_names])
    try:
      reply = session.time(calls_per_round(len(sets)), TIMING_WARMUP, TIMING_ROUNDS, TIME_TIMEOUT_S)
    except session_lib.RunnerFailure as e:
      _failure(emit, "timing", e, dims)
      return False
    finally:
      session.close()
  if reply.timed_set != 0:
    emit({"kind": "error", "stage": "timing", "status": "runtime_error",
          "feedback": f"the harness timed set {reply.timed_set} last, not set 0"})
    return False
  kernel_ms = [max(ms, timing.RESOLUTION_MS) for ms in reply.ms]
  k = statistics.median(kernel_ms)
  out_bytes = reply.timed_output.nbytes
  bound = verdict_lib.roofline_ms(sum(x.nbytes for x in sets[0]), out_bytes)
  emit({"kind": "timing_output", "output": reply.timed_output})
  emit({"kind": "timing", "kernel_ms": k, "flags": verdict_lib.roofline_flags(k, bound),
        "samples": {"kernel_ms": kernel_ms}})
  return True


def run(payload: dict[str, Any], emit: Callable[[dict[str, Any]], None], tmpdir: str) -> None:
  durations: dict[str, float] = {}
  on_gpu = _gpu_visible()
  emit({"kind": "env", "platform": "gpu" if on_gpu else "cpu"})
  emit({"kind": "stage", "stage": "compile"})
  t0 = time.monotonic()
  sig = signature(payload)
  tc = toolchain_lib.find_toolchain()
  library = _compile(payload, sig, tc, tmpdir, emit)
  if library is None:
    return
  durations["compile"] = time.monotonic() - t0
  if payload["stages"] == "compile":
    emit({"kind": "done", "durations": durations})
    return
  if not on_gpu:
    emit({"kind": "not_run", "feedback": "not_run: no GPU. The source passed the static checks, compiled with "
          f"nvcc {tc.version} and passed the symbol audit; correctness was not checked."})
    emit({"kind": "done", "durations": durations})
    return
  emit({"kind": "stage", "stage": "correctness"})
  t0 = time.monotonic()
  runner = compile_lib.build_runner(tc, private_dir=tmpdir)
  sanitizer = session_lib.sanitizer_path(tc.root) if os.environ.get(SANITIZER_ENV) == "1" else None
  if not _check(payload, sig, runner, library, sanitizer, emit):
    return
  durations["correctness"] = time.monotonic() - t0
  if payload["stages"] == "full" and payload.get("timing_trials") and not sanitizer:
    emit({"kind": "stage", "stage": "timing"})
    t0 = time.monotonic()
    if not _time(payload, sig, runner, library, emit):
      return
    durations["timing"] = time.monotonic() - t0
  emit({"kind": "done", "durations": durations})
