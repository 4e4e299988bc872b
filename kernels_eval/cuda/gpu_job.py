"""Worker side of the CUDA backend: the runner `kernels_eval.cuda.gpu_job:run` (protocol: `backends`).

Runs in a sandboxed child that imported JAX but never loads candidate code itself: the candidate
library is loaded only by the harness program (`runner.cu`), a grandchild that inherits the sandbox
(uid, rlimits, no network, process group). Steps:

  1. reference outputs with JAX for every trial, before any candidate process exists (matmuls at
     "highest" precision, so TF32 cannot blur the verdict);
  2. stage compile: the library from the compile cache, which the parent filled while checking the
     request (`backend.static_check`); the child only reads the cache, and compiles privately on a miss;
     then the symbol audit again;
  3. no GPU: `not_run` (never `correct`);
  4. stage correctness: per distinct check-dims entry one harness process runs `check`; outputs go to the
     parent, which compares them with the reference. Harness findings end the run with an error:
     no kernel launched, a launch on another stream, a modified input, trial 0 not reproducible;
  5. stage timing (stages="full"): interleaved rounds at the timing dims, harness `time` (CUDA events,
     L2 flush, device-wide sync, rotating inputs) against the jitted reference; the last timed output
     is re-checked; a flag for beating the memory roofline (the core flags > 10x speedups).
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

from kernels_eval import compare as compare_lib
from kernels_eval import reference_runner
from kernels_eval import sandbox
from kernels_eval import task as task_lib
from kernels_eval.cuda import audit as audit_lib
from kernels_eval.cuda import compile as compile_lib
from kernels_eval.cuda import prototype as prototype_lib
from kernels_eval.cuda import session as session_lib
from kernels_eval.cuda import toolchain as toolchain_lib
from kernels_eval.cuda import verdict as verdict_lib

L2_FLUSH_BYTES = 256 << 20
TIMING_ROUNDS, TIMING_REPS, TIMING_WARMUP = 3, 20, 3
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


def _time_reference(fn: Callable[..., Any], sets: list[list[jax.Array]], reps: int, warmup: int) -> list[float]:
  """Wall time (ms) of each jitted reference call, after an L2 flush and a device-wide sync."""
  flush = jnp.zeros((L2_FLUSH_BYTES // 4,), jnp.float32)
  bump = jax.jit(lambda x: x + 1.0)
  for i in range(warmup):
    jax.block_until_ready(fn(*sets[i % len(sets)]))
  out = []
  for i in range(reps):
    flush = jax.block_until_ready(bump(flush))
    start = time.perf_counter()
    jax.block_until_ready(fn(*sets[i % len(sets)]))
    out.append((time.perf_counter() - start) * 1e3)
  return out


def _failure(emit, stage: str, e: session_lib.RunnerFailure, dims: dict[str, int]) -> None:
  sizes = ", ".join(f"{k}={v}" for k, v in dims.items())
  if e.kind == "no_device":
    emit({"kind": "not_run", "stage": "compile", "feedback": f"not_run: no usable GPU for the CUDA 13 runtime "
          f"({e.message}; CUDA 13 needs an NVIDIA driver >= 580)"})
    emit({"kind": "done", "durations": {}})
    return
  if e.kind == "timeout":
    status = "timeout"
  elif e.kind in ("cuda_error", "crash", "sanitizer"):
    status = "runtime_error"
  else:
    emit({"kind": "reference_error", "feedback": f"CUDA harness failed: {e.message}"})
    return
  msg = {"kind": "error", "stage": stage, "status": status, "feedback": f"{e.kind} ({sizes}): {e.message}"}
  if e.kind == "sanitizer":
    msg["rejected_reason"] = "memory_error"
  emit(msg)


def run(payload: dict[str, Any], emit: Callable[[dict[str, Any]], None], tmpdir: str) -> None:
  durations: dict[str, float] = {}
  on_gpu = _gpu_visible()
  emit({"kind": "env", "platform": "gpu" if on_gpu else "cpu"})
  trials = payload["trials"]
  t0 = time.monotonic()
  try:
    with jax.default_matmul_precision("highest"):
      ref_fn = jax.jit(reference_runner.load_reference(payload["task"]))
      references = reference_runner.compute(ref_fn, trials)
  except Exception as e:  # noqa: BLE001  (any failure of the reference is the task's)
    emit({"kind": "reference_error", "feedback": sandbox.format_exception(e)})
    return
  emit({"kind": "reference", "outputs": references})
  durations["reference"] = time.monotonic() - t0

  emit({"kind": "stage", "stage": "compile"})
  t0 = time.monotonic()
  sig = signature(payload)
  source = payload["source"]
  tc = toolchain_lib.find_toolchain()
  compiled = compile_lib.compile_source(source + sig.entry_shim(), toolchain_lib.target_arch(), tc,
                                        prototype=sig.prototype(), private_dir=tmpdir)
  if not compiled.ok:
    emit({"kind": "error", "stage": "compile", "status": "compile_error", "feedback": compiled.feedback})
    return
  rejection = audit_lib.audit_library(compiled.library, source, ("solution", prototype_lib.ENTRY_SYMBOL))
  if rejection is not None:
    emit({"kind": "error", "stage": "compile", "status": "compile_error", "rejected_reason": rejection.reason,
          "feedback": rejection.feedback()})
    return
  durations["compile"] = time.monotonic() - t0
  if payload["stages"] == "compile":
    emit({"kind": "done", "durations": durations})
    return
  if not on_gpu:
    emit({"kind": "not_run", "stage": "compile", "feedback": "not_run: no GPU. The source passed the static "
          f"checks, compiled with nvcc {tc.version} and passed the symbol audit; correctness was not checked."})
    emit({"kind": "done", "durations": durations})
    return

  emit({"kind": "stage", "stage": "correctness"})
  t0 = time.monotonic()
  runner = compile_lib.build_runner(tc, private_dir=tmpdir)
  sanitizer = session_lib.sanitizer_path(tc.root) if os.environ.get(SANITIZER_ENV) == "1" else None
  tol = payload.get("tolerance") or task_lib.DEFAULT_TOLERANCE[sig.output_dtype]
  for ids in dims_groups(payload["trial_dims"]):
    dims = payload["trial_dims"][ids[0]]
    ref = references[ids[0]]
    session = session_lib.RunnerSession(runner, compiled.library, [trials[t] for t in ids], ref.shape,
                                        ref.dtype, [dims[d] for d in sig.dim_names], sanitizer=sanitizer)
    try:
      reply = session.check(timeout_s=CHECK_TIMEOUT_S)
    except session_lib.RunnerFailure as e:
      _failure(emit, "correctness", e, dims)
      return
    finally:
      session.close()
    problem = verdict_lib.harness_findings(reply.launches, reply.foreign_streams,
                                           [(ids[t], k) for t, k in reply.mutated], list(sig.input_names))
    if problem is None:
      problem = verdict_lib.determinism(reply.outputs[0], reply.determinism, tol)
    if problem is not None:
      emit({"kind": "error", "stage": "correctness", "status": "wrong_output", "rejected_reason": problem[0],
            "feedback": problem[1]})
      return
    for t, out in zip(ids, reply.outputs):
      emit({"kind": "output", "trial": t, "output": out})
  durations["correctness"] = time.monotonic() - t0

  if payload["stages"] == "full" and payload.get("timing_trials") and not sanitizer:
    emit({"kind": "stage", "stage": "timing"})
    t0 = time.monotonic()
    sets, dims = payload["timing_trials"], payload["timing_dims"]
    with jax.default_matmul_precision("highest"):
      set_refs = reference_runner.compute(ref_fn, sets)
      device_sets = [[jnp.asarray(x) for x in inputs] for inputs in sets]
      session = session_lib.RunnerSession(runner, compiled.library, sets, set_refs[0].shape, set_refs[0].dtype,
                                          [dims[d] for d in sig.dim_names])
      kernel_ms: list[float] = []
      reference_ms: list[float] = []
      try:
        for _ in range(TIMING_ROUNDS):
          reply = session.time(TIMING_REPS, TIMING_WARMUP, TIME_TIMEOUT_S)
          kernel_ms += reply.ms
          reference_ms += _time_reference(ref_fn, device_sets, TIMING_REPS, TIMING_WARMUP)
      except session_lib.RunnerFailure as e:
        _failure(emit, "timing", e, dims)
        return
      finally:
        session.close()
    recheck = compare_lib.compare(reply.timed_output, set_refs[reply.timed_set], tol["atol"], tol["rtol"])
    if not recheck.ok:
      emit({"kind": "error", "stage": "timing", "status": "wrong_output", "rejected_reason": "timed_output_mismatch",
            "feedback": f"the output of a timed call is wrong (results must not be cached): {recheck.message}"})
      return
    k, r = statistics.median(kernel_ms), statistics.median(reference_ms)
    bound = verdict_lib.roofline_ms(sum(x.nbytes for x in sets[0]), set_refs[0].nbytes)
    emit({"kind": "timing", "kernel_ms": k, "reference_ms": r, "flags": verdict_lib.roofline_flags(k, bound),
          "samples": {"kernel_ms": kernel_ms, "reference_ms": reference_ms}})
    durations["timing"] = time.monotonic() - t0
  emit({"kind": "done", "durations": durations})
