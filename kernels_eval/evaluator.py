"""The evaluator core: requests in, `EvalResult`s out, the same for every language backend.

Per request, in the parent (no JAX): a level-0 answer completed into its task's skeleton
(`skeleton.fill_skeleton`); the backend's static check, failing closed (`checked_static`); the trial seed
HMAC(secret, task hash | request id) and the trial inputs; one job on the worker pool in two steps, each
in its own fresh sandboxed child: the reference (no candidate code ever runs in that process), then the
candidate; then the verdict, made here from the frames the protocol accepts (`protocol`, `verdicts`):
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
import threading
import time
import uuid
from typing import Any

from kernels_eval import backends
from kernels_eval import jail
from kernels_eval import pool as pool_lib
from kernels_eval import protocol
from kernels_eval import sandbox
from kernels_eval import schema
from kernels_eval import skeleton
from kernels_eval import static_check as static_check_lib
from kernels_eval import task as task_lib
from kernels_eval import trials as trials_lib
from kernels_eval import verdicts
from kernels_eval.kernelbench import answers as kernelbench_answers
from kernels_eval.kernelbench import evaluate as kernelbench_evaluate

REQUEST_STAGES = ("static", "compile", "correctness", "full")
SUSPICIOUS_SPEEDUP = verdicts.SUSPICIOUS_SPEEDUP
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
  return hashlib.sha256(source.encode("utf-8", errors="surrogatepass")).hexdigest()


def _harness_failure(request: EvalRequest, error: Exception,
                     prov: schema.Provenance | None = None) -> schema.EvalResult:
  """The verdict when the evaluator itself failed: an infrastructure error (retried, never penalised)."""
  return schema.EvalResult(status="runtime_error", stage="static", infra_error=f"evaluator: {error!r}",
                           provenance=prov or schema.Provenance(), task_id=request.task.id, lang=request.lang,
                           request_id=request.request_id)


def checked_static(backend: backends.Backend, task: task_lib.Task, source: str) -> static_check_lib.Rejection | None:
  """The backend's static check, failing closed: any exception while checking the candidate is its
  `compile_error` (`static_check_failed`); only a machine that cannot isolate is the harness's problem."""
  try:
    if task.kernelbench is not None and backend.lang == "cuda":
      return kernelbench_answers.check_answer(source)[1]
    return backend.static_check(task, source)
  except jail.IsolationUnavailable:
    raise
  except Exception as e:  # noqa: BLE001
    return static_check_lib.Rejection("static_check_failed", "the static check could not process this source "
                                      f"({type(e).__name__}: {str(e)[:300]})")


def _durations(**kw: float) -> dict[str, float]:
  return {k: round(float(v), 6) for k, v in kw.items()}


class Evaluator:
  """Evaluates requests on a pool of sandboxed workers.

  executor: "local" (worker processes on this machine) or "ray" (`ray_executor.RayPool` on the cluster at
  `address`; `workers` CPU actors plus one GPU actor per GPU). workers: pool size (1-2 on 2 cores).
  secret: HMAC key of the trial seeds (default: env KERNELS_EVAL_SECRET as hex, else random per
  evaluator). timeout_s: per-job wall limit (default: the backend's). cache_size: verdicts kept.
  compile_cache_dir: opt-in persistent JAX compilation cache for the workers (see `pool`).
  limits: sandbox limits (`sandbox.Limits`). isolation: "namespaces" (default) or the explicit opt-out
  "process" for machines that cannot make namespaces (see `sandbox`). time_on_cpu: on a CPU machine, run
  the timing stage anyway, at the task's first check sizes (a dry run of the GPU path; the times mean
  nothing).
  A local pool starts one worker at once: a machine that cannot isolate jobs is reported here, by
  `jail.IsolationUnavailable`, before any candidate is taken.
  """

  def __init__(self, executor: str = "local", workers: int = 2, *, secret: bytes | None = None,
               timeout_s: float | None = None, max_jobs_per_worker: int = 200, cache_size: int = 4096,
               limits: sandbox.Limits | None = None, platform: str | None = None,
               compile_cache_dir: str | os.PathLike | None = None, address: str | None = None,
               isolation: str | None = None, time_on_cpu: bool = False):
    if executor not in ("local", "ray"):
      raise ValueError(f"executor={executor!r} is not supported (use 'local' or 'ray')")
    if secret is None:
      env = os.environ.get("KERNELS_EVAL_SECRET")
      secret = bytes.fromhex(env) if env else os.urandom(32)
    if len(secret) < 16:
      raise ValueError("secret must be at least 16 bytes")
    self._secret = bytes(secret)
    self.timeout_s = timeout_s
    self.time_on_cpu = time_on_cpu
    if executor == "ray":
      from kernels_eval import ray_executor  # pylint: disable=import-outside-toplevel  (ray is optional)
      self.pool = ray_executor.RayPool(backends.runners(), address=address, cpu_workers=workers, limits=limits,
                                       max_jobs=max_jobs_per_worker)
    else:
      self.pool = pool_lib.WorkerPool(backends.runners(), workers=workers, max_jobs=max_jobs_per_worker,
                                      limits=limits, platform=platform, compile_cache_dir=compile_cache_dir,
                                      isolation=isolation)
      try:
        self.pool.warm_up(1)
      except BaseException:
        self.pool.close()
        raise
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
    rejection = checked_static(backend, request.task, source)
    prov.durations = _durations(static=time.monotonic() - start)
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
    timeout = request.timeout_s or self.timeout_s or backend.timeout_s

    def result(status: str, stage_: str, feedback: str, **kw) -> schema.EvalResult:
      return schema.EvalResult(status=status, stage=stage_, feedback=feedback, provenance=prov, **base, **kw)

    if request.task.kernelbench is not None:
      self._finish_kernelbench(request, source, seed, timeout, result, prov, key, start, done)
      return
    payload, trial_inputs = self._payload(request, source, seed)
    expect = protocol.Expect(len(trial_inputs), request.stages, timing="timing_trials" in payload)
    job = self.pool.submit(["reference", request.lang], payload, timeout)

    def finish(f: concurrent.futures.Future) -> None:
      try:
        outcome = f.result()
        self._provenance(prov, outcome, start)
        result_ = verdicts.from_outcome(request.task, request.stages, outcome, "reference", request.lang, expect,
                                        trial_inputs, timeout, result, prov)
      except Exception as e:  # noqa: BLE001  (a harness bug must not hang the caller)
        result_ = _harness_failure(request, e, prov)
      if result_.infra_error is None and result_.status != "timeout":
        self._remember(key, result_)
      done.set_result(result_)

    job.add_done_callback(finish)

  def _finish_kernelbench(self, request: EvalRequest, source: str, seed: int, timeout: float, result,
                          prov: schema.Provenance, key: tuple, start: float, done: concurrent.futures.Future) -> None:
    """A KernelBench task's verdict (`kernelbench.evaluate`; its jobs are waited for on this thread)."""
    gpu = self.pool.platform != "cpu"
    if request.lang == "cuda":
      result_ = kernelbench_evaluate.evaluate_cuda(self.pool, request, source, seed, timeout, gpu, result, prov)
    else:
      result_ = kernelbench_evaluate.evaluate_pallas(self.pool, request, source, seed, timeout, gpu, result, prov)
    prov.durations.update(_durations(total=time.monotonic() - start))
    if result_.infra_error is None and result_.status != "timeout":
      self._remember(key, result_)
    done.set_result(result_)

  def _payload(self, request: EvalRequest, source: str, seed: int) -> tuple[dict[str, Any], list]:
    """The job's payload (inputs drawn here, from the secret seed) and its trial inputs."""
    task = request.task
    trial_inputs = trials_lib.all_trials(task, seed)
    payload = {"task": task.to_job(), "source": source, "stages": request.stages, "trials": trial_inputs,
               "trial_dims": [task.check_dims[t % len(task.check_dims)] for t in range(len(trial_inputs))],
               "input_dtypes": [i.dtype for i in task.inputs]}
    on_gpu = self.pool.platform != "cpu"
    if (on_gpu or self.time_on_cpu) and request.stages == "full":
      dims = task.timing_dims if on_gpu else task.check_dims[0]
      first = trials_lib.trial_inputs(task, seed, 100, dims)
      set_bytes = sum(x.nbytes for x in first)
      n_sets = min(TIMING_SETS, MAX_TIMING_PAYLOAD_BYTES // max(set_bytes, 1))
      if n_sets >= 1:
        payload["timing_trials"] = [first] + [trials_lib.trial_inputs(task, seed, 100 + k, dims)
                                              for k in range(1, n_sets)]
        payload["timing_dims"] = dims
    return payload, trial_inputs

  @staticmethod
  def _provenance(prov: schema.Provenance, outcome: pool_lib.JobOutcome, start: float) -> None:
    """The worker's toolchain and the wall times measured here (the steps' own come from their reports)."""
    prov.toolchain = dict(outcome.toolchain)
    prov.durations.update(_durations(total=time.monotonic() - start))
    if outcome.cold_start_s:
      prov.durations.update(_durations(worker_start=outcome.cold_start_s))

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
