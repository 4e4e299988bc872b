"""The evaluator core: requests in, `EvalResult`s out, the same for every language backend.

Per request, in the parent (no JAX): a level-0 answer completed into its task's skeleton
(`skeleton.fill_skeleton`); the backend's static check; the trial seed
HMAC(secret, task hash | request id) and the trial inputs; one job on the worker pool, where a fresh
sandboxed child computes the reference, then loads and runs the candidate; then the verdict, made here:
each trial's output against the reference (`compare`), status and stage, feedback (<= 1.5 KB) and
provenance (source hash, seed, toolchain, per-stage durations, cache hit).

Stages requested: "static" (parent only), "compile" (+ compile and lower), "correctness" (+ trials),
"full" (+ timing where a GPU is present). A request that passes everything it asked for short of the
trials ends `not_run`. Identical (task, language, stages, source) requests reuse the first verdict
(`provenance.cache_hit`); timeouts and infrastructure errors are never reused.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import os
import signal
import threading
import time
import uuid
from typing import Any

from kernels_eval import backends
from kernels_eval import compare
from kernels_eval import pool as pool_lib
from kernels_eval import sandbox
from kernels_eval import schema
from kernels_eval import skeleton
from kernels_eval import task as task_lib
from kernels_eval import trials as trials_lib

REQUEST_STAGES = ("static", "compile", "correctness", "full")
SUSPICIOUS_SPEEDUP = 10.0
TIMING_SETS = 3                          # input sets rotated through the timed runs
MAX_TIMING_PAYLOAD_BYTES = 160 << 20     # timing inputs travel in one frame (wire.MAX_FRAME_BYTES)


@dataclasses.dataclass
class EvalRequest:
  task: task_lib.Task
  source: str
  lang: str
  stages: str = "full"
  request_id: str | None = None
  timeout_s: float | None = None

  def __post_init__(self):
    if self.stages not in REQUEST_STAGES:
      raise ValueError(f"EvalRequest.stages={self.stages!r} is not one of {REQUEST_STAGES}")
    if not isinstance(self.source, str):
      raise ValueError(f"EvalRequest.source must be a str, got {type(self.source).__name__}")
    if self.request_id is None:
      self.request_id = uuid.uuid4().hex


def source_hash(source: str) -> str:
  return hashlib.sha256(source.encode("utf-8")).hexdigest()


def _harness_failure(request: EvalRequest, error: Exception,
                     prov: schema.Provenance | None = None) -> schema.EvalResult:
  """The verdict when the evaluator itself failed: an infrastructure error (retried, never penalised)."""
  return schema.EvalResult(status="runtime_error", stage="static", infra_error=f"evaluator: {error!r}",
                           provenance=prov or schema.Provenance(), task_id=request.task.id, lang=request.lang,
                           request_id=request.request_id)


def _durations(**kw: float) -> dict[str, float]:
  return {k: round(float(v), 6) for k, v in kw.items()}


class Evaluator:
  """Evaluates requests on a pool of sandboxed workers.

  executor: "local" (worker processes on this machine) or "ray" (`ray_executor.RayPool` on the cluster at
  `address`; `workers` CPU actors plus one GPU actor per GPU). workers: pool size (1-2 on 2 cores).
  secret: HMAC key of the trial seeds (default: env KERNELS_EVAL_SECRET as hex, else random per
  evaluator). timeout_s: per-job wall limit (default: the backend's). cache_size: verdicts kept.
  compile_cache_dir: opt-in persistent JAX compilation cache for the workers (see `pool`).
  """

  def __init__(self, executor: str = "local", workers: int = 2, *, secret: bytes | None = None,
               timeout_s: float | None = None, max_jobs_per_worker: int = 200, cache_size: int = 4096,
               limits: sandbox.Limits | None = None, platform: str | None = None,
               compile_cache_dir: str | os.PathLike | None = None, address: str | None = None):
    if executor not in ("local", "ray"):
      raise ValueError(f"executor={executor!r} is not supported (use 'local' or 'ray')")
    if secret is None:
      env = os.environ.get("KERNELS_EVAL_SECRET")
      secret = bytes.fromhex(env) if env else os.urandom(32)
    if len(secret) < 16:
      raise ValueError("secret must be at least 16 bytes")
    self._secret = bytes(secret)
    self.timeout_s = timeout_s
    if executor == "ray":
      from kernels_eval import ray_executor  # pylint: disable=import-outside-toplevel  (ray is optional)
      self.pool = ray_executor.RayPool(backends.runners(), address=address, cpu_workers=workers, limits=limits,
                                       max_jobs=max_jobs_per_worker)
    else:
      self.pool = pool_lib.WorkerPool(backends.runners(), workers=workers, max_jobs=max_jobs_per_worker,
                                      limits=limits, platform=platform, compile_cache_dir=compile_cache_dir)
    # Static checks run on parent threads: CUDA's compiles (nvcc subprocesses) in parallel up to the core count.
    self._static_threads = concurrent.futures.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1),
                                                                 thread_name_prefix="eval-static")
    self._cache: collections.OrderedDict[tuple, schema.EvalResult] = collections.OrderedDict()
    self._cache_size = cache_size
    self._lock = threading.Lock()

  # Seeds and inputs.
  def seed_for(self, task: task_lib.Task, request_id: str) -> int:
    return trials_lib.derive_seed(self._secret, task.source_hash, request_id)

  def run_job(self, runner: str, payload: dict[str, Any], timeout_s: float) -> concurrent.futures.Future:
    """Submits a raw job to the pool (used by `validate_task`)."""
    return self.pool.submit(runner, payload, timeout_s)

  # Public API.
  def submit(self, request: EvalRequest) -> concurrent.futures.Future:
    """Starts one evaluation; the future resolves to its EvalResult."""
    start = time.monotonic()
    backend = backends.get(request.lang)
    source = skeleton.fill_skeleton(request.task, request.lang, request.source)
    key = (request.task.source_hash, request.lang, request.stages, source_hash(source))
    done: concurrent.futures.Future = concurrent.futures.Future()
    with self._lock:
      cached = self._cache.get(key)
      if cached is not None:
        self._cache.move_to_end(key)
    if cached is not None:
      result = schema.EvalResult.from_dict(cached.to_dict())
      result.request_id = request.request_id
      result.provenance.cache_hit = True
      done.set_result(result)
      return done
    self._static_threads.submit(self._start, request, backend, source, key, start, done)
    return done

  def _start(self, request: EvalRequest, backend: backends.Backend, source: str, key: tuple, start: float,
             done: concurrent.futures.Future) -> None:
    """Static check (for CUDA: compile and symbol audit) on a parent thread, then the job on the pool."""
    try:
      self._static_then_job(request, backend, source, key, start, done)
    except Exception as e:  # noqa: BLE001  (a harness bug must not hang the caller)
      if not done.done():
        done.set_result(_harness_failure(request, e))

  def _static_then_job(self, request: EvalRequest, backend: backends.Backend, source: str, key: tuple,
                       start: float, done: concurrent.futures.Future) -> None:
    seed = self.seed_for(request.task, request.request_id)
    base = dict(task_id=request.task.id, lang=request.lang, request_id=request.request_id)
    prov = schema.Provenance(source_hash=key[3], seed=seed)
    rejection = backend.static_check(request.task, source)
    static_s = time.monotonic() - start
    prov.durations = _durations(static=static_s)
    if rejection is not None or request.stages == "static":
      if rejection is not None:
        result = schema.EvalResult(status="compile_error", stage="static", rejected_reason=rejection.reason,
                                   feedback=rejection.feedback(), provenance=prov, **base)
      else:
        result = schema.EvalResult(status="not_run", stage="static", provenance=prov,
                                   feedback="static check passed; later stages not requested", **base)
      self._remember(key, result)
      done.set_result(result)
      return
    task = request.task
    trial_inputs = trials_lib.all_trials(task, seed)
    payload = {"task": task.to_job(), "source": source, "stages": request.stages,
               "trials": trial_inputs,
               "trial_dims": [task.check_dims[t % len(task.check_dims)] for t in range(len(trial_inputs))],
               "input_dtypes": [i.dtype for i in task.inputs]}
    if self.pool.platform != "cpu" and request.stages == "full":
      first = trials_lib.trial_inputs(task, seed, 100, task.timing_dims)
      set_bytes = sum(x.nbytes for x in first)
      n_sets = min(TIMING_SETS, MAX_TIMING_PAYLOAD_BYTES // max(set_bytes, 1))
      if n_sets >= 1:
        payload["timing_trials"] = [first] + [trials_lib.trial_inputs(task, seed, 100 + k, task.timing_dims)
                                              for k in range(1, n_sets)]
        payload["timing_dims"] = task.timing_dims
    timeout = request.timeout_s or self.timeout_s or backend.timeout_s
    job = self.pool.submit(request.lang, payload, timeout)

    def finish(f: concurrent.futures.Future) -> None:
      try:
        result = self._verdict(request, f.result(), prov, base, timeout, trial_inputs, start)
      except Exception as e:  # noqa: BLE001  (a harness bug must not hang the caller)
        result = _harness_failure(request, e, prov)
      if result.infra_error is None and result.status != "timeout":
        self._remember(key, result)
      done.set_result(result)

    job.add_done_callback(finish)

  def evaluate(self, request: EvalRequest) -> schema.EvalResult:
    return self.submit(request).result()

  def evaluate_many(self, requests: list[EvalRequest]) -> list[schema.EvalResult]:
    """Evaluates all requests concurrently on the pool; results in request order."""
    futures = [self.submit(r) for r in requests]
    return [f.result() for f in futures]

  def close(self) -> None:
    self._static_threads.shutdown(wait=True)
    self.pool.close()

  def __enter__(self) -> "Evaluator":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _remember(self, key: tuple, result: schema.EvalResult) -> None:
    if self._cache_size <= 0:
      return
    with self._lock:
      self._cache[key] = result
      while len(self._cache) > self._cache_size:
        self._cache.popitem(last=False)

  # Verdicts.
  def _verdict(self, request: EvalRequest, outcome: pool_lib.JobOutcome, prov: schema.Provenance,
               base: dict[str, Any], timeout: float, trial_inputs: list, start: float) -> schema.EvalResult:
    task = request.task
    prov.toolchain = dict(outcome.toolchain)
    stage = "compile"
    reference = None
    outputs: dict[int, Any] = {}
    error = not_run = timing = None
    timed_outputs: dict[str, Any] = {}
    done = False
    for msg in outcome.messages:
      kind = msg.get("kind") if isinstance(msg, dict) else None
      if kind == "env":
        prov.toolchain["platform"] = str(msg.get("platform"))
      elif kind == "reference" and reference is None:
        reference = msg["outputs"]
      elif kind == "reference_error":
        error = ("infra", f"task reference failed: {msg.get('feedback', '')}")
      elif kind == "crash" and reference is None:
        error = ("infra", f"the job failed before the reference: {msg.get('error', '')}")
      elif reference is None:
        continue
      elif kind == "stage" and msg.get("stage") in schema.STAGES:
        stage = msg["stage"]
      elif kind == "error" and error is None:
        error = msg
      elif kind == "output":
        outputs[int(msg["trial"])] = msg["output"]
      elif kind == "not_run":
        not_run = msg
      elif kind == "timing":
        timing = msg
      elif kind in ("timing_reference", "timing_output"):
        timed_outputs[kind] = msg["output"]
      elif kind == "crash" and error is None:
        error = {"status": "runtime_error", "stage": stage, "feedback": f"the process crashed:\n{msg['error']}"}
      elif kind == "done":
        done = True
        prov.durations.update(_durations(**{k: v for k, v in msg.get("durations", {}).items()
                                            if isinstance(v, (int, float))}))
    prov.durations.update(_durations(total=time.monotonic() - start))
    if outcome.cold_start_s:
      prov.durations.update(_durations(worker_start=outcome.cold_start_s))

    def result(status: str, stage_: str, feedback: str, **kw) -> schema.EvalResult:
      return schema.EvalResult(status=status, stage=stage_, feedback=feedback, provenance=prov, **base, **kw)

    if outcome.infra_error:
      return result("runtime_error", stage, "", infra_error=outcome.infra_error)
    if isinstance(error, tuple):
      return result("runtime_error", "compile", "", infra_error=error[1][-1000:])
    if reference is None:
      if outcome.timed_out:
        return result("runtime_error", "compile", "", infra_error=f"task reference did not finish in {timeout:g} s")
      return result("runtime_error", "compile", "", infra_error=f"no reference outputs (child exit "
                    f"{outcome.exit_code}, signal {outcome.signal})")
    if outcome.timed_out:
      return result("timeout", stage, f"timed out after {timeout:g} s in stage {stage} (infinite loop, or "
                    "too much work for the check sizes)")
    if outcome.memory_killed:
      return result("runtime_error", stage, f"killed in stage {stage}: memory use above the sandbox limit",
                    flags=["memory_limit"])
    if error is not None:
      status = error.get("status") if error.get("status") in (
          "compile_error", "runtime_error", "wrong_output", "timeout") else "runtime_error"
      err_stage = error.get("stage") if error.get("stage") in schema.STAGES else stage
      head = f"{status.replace('_', ' ')} (stage {err_stage}): "
      return result(status, err_stage, head + str(error.get("feedback", "")),
                    rejected_reason=error.get("rejected_reason"))
    if not done:
      sig = f"signal {signal.Signals(outcome.signal).name}" if outcome.signal else f"exit code {outcome.exit_code}"
      flags = ["memory_limit"] if outcome.signal in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT) else []
      return result("runtime_error", stage, f"the process died in stage {stage} ({sig}); out of memory or "
                    "an illegal operation", flags=flags)
    if request.stages == "compile":
      return result("not_run", stage, "compiled and lowered; correctness not requested")
    if not_run is not None:
      nr_stage = not_run.get("stage") if not_run.get("stage") in schema.STAGES else stage
      return result("not_run", nr_stage, str(not_run.get("feedback", "")))
    return self._check_outputs(task, reference, outputs, trial_inputs, timing, timed_outputs, result)

  def _check_outputs(self, task, reference, outputs, trial_inputs, timing, timed_outputs,
                     result) -> schema.EvalResult:
    n = len(reference)
    for t in range(n):
      if t not in outputs:
        return result("runtime_error", "correctness", f"trial {t + 1} of {n} produced no output",
                      trials_passed=t, trials_total=n)
      ref = reference[t]
      tol = task.tolerance_for(ref.dtype.name if ref.dtype.name in task_lib.DTYPES else "float32")
      cmp = compare.compare(outputs[t], ref, tol["atol"], tol["rtol"])
      if not cmp.ok:
        shapes = ", ".join(f"{s.name}{list(x.shape)}" for s, x in zip(task.inputs, trial_inputs[t]))
        return result("wrong_output", "correctness",
                      f"wrong output in trial {t + 1} of {n} (inputs {shapes}): {cmp.message}",
                      trials_passed=t, trials_total=n, max_abs_error=cmp.max_abs_error,
                      max_rel_error=cmp.max_rel_error, mismatch_count=cmp.mismatch_count,
                      first_mismatches=cmp.first_mismatches)
    timing_rec, flags, stage, extra = None, [], "correctness", ""
    if len(timed_outputs) == 2:
      ref = timed_outputs["timing_reference"]
      tol = task.tolerance_for(ref.dtype.name if ref.dtype.name in task_lib.DTYPES else "float32")
      cmp = compare.compare(timed_outputs["timing_output"], ref, tol["atol"], tol["rtol"])
      if not cmp.ok:
        return result("wrong_output", "timing", f"wrong output at the timing sizes: {cmp.message}",
                      trials_passed=n, trials_total=n, flags=["timing_output_mismatch"],
                      max_abs_error=cmp.max_abs_error, mismatch_count=cmp.mismatch_count,
                      first_mismatches=cmp.first_mismatches)
    if timing is not None:
      k, r = float(timing["kernel_ms"]), float(timing["reference_ms"])
      speedup = r / k if k > 0 else float("inf")
      timing_rec = schema.Timing(kernel_ms=k, reference_ms=r, speedup=speedup)
      stage = "timing"
      flags += [f for f in timing.get("flags", []) if isinstance(f, str)]
      extra = f"; kernel {k:.4g} ms vs reference {r:.4g} ms (speedup {speedup:.3g}x)"
      if speedup > SUSPICIOUS_SPEEDUP:
        flags.append("suspicious_speedup")
    return result("correct", stage, f"correct: {n} of {n} trials passed{extra}", trials_passed=n,
                  trials_total=n, timing=timing_rec, flags=flags)


_default: Evaluator | None = None
_default_lock = threading.Lock()


def default_evaluator() -> Evaluator:
  """A process-wide evaluator (created on first use, closed at exit)."""
  global _default  # pylint: disable=global-statement
  with _default_lock:
    if _default is None:
      import atexit  # pylint: disable=import-outside-toplevel
      _default = Evaluator()
      atexit.register(_default.close)
    return _default


def evaluate(task: task_lib.Task, source: str, lang: str, *, stages: str = "full",
             request_id: str | None = None) -> schema.EvalResult:
  """Evaluates one candidate with the default evaluator."""
  return default_evaluator().evaluate(EvalRequest(task, source, lang, stages, request_id))


def missing_code_result(task: task_lib.Task, lang: str, message: str,
                        request_id: str | None = None) -> schema.EvalResult:
  """The verdict for a reply without a code block (`extract_code` raised NoCodeBlock)."""
  return schema.EvalResult(status="compile_error", stage="static", task_id=task.id, lang=lang,
                           request_id=request_id or "", rejected_reason="no_code_block", feedback=message)
