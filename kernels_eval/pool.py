"""A pool of warm workers (`kernels_eval.worker`), driven from the parent without importing JAX.

Each worker process imports JAX once and forks a sandboxed child per job. The pool hands jobs to idle
workers from a thread per slot, and replaces a worker after `max_jobs` jobs, after it stops answering
(infrastructure failure) or when it exits. Child crashes and timeouts are the child's: the worker
survives them. Worker environment: single-threaded XLA on CPU, no GPU memory preallocation, no
persistent compilation cache unless `compile_cache_dir` is given. That cache is opt-in (CI, trusted
candidates): children write it through JAX, and candidate code has no file API (static check, audit
hook), but a shared cache written by processes that ran untrusted code is a trust decision.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import pathlib
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from kernels_eval import sandbox
from kernels_eval import wire

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[1]
CPU_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
STARTUP_TIMEOUT_S = 120.0
WORKER_SLACK_S = 30.0


def has_gpu() -> bool:
  """True when an NVIDIA device node exists (checked without importing JAX)."""
  return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


@dataclasses.dataclass
class JobOutcome:
  """One job's result as seen by the parent. `infra_error` is set when the worker, not the child, failed."""
  messages: list[dict[str, Any]]
  exit_code: int | None = None
  signal: int | None = None
  timed_out: bool = False
  memory_killed: bool = False
  truncated: bool = False
  complete: bool = True
  wall_s: float = 0.0
  infra_error: str | None = None
  toolchain: dict[str, str] = dataclasses.field(default_factory=dict)
  cold_start_s: float = 0.0


class WorkerDied(RuntimeError):
  pass


class _Worker:
  """One worker process and its protocol pipes."""

  def __init__(self, config: dict[str, Any], env: dict[str, str], log_path: str):
    self.log = open(log_path, "ab")  # noqa: SIM115  (lives as long as the worker)
    start = time.monotonic()
    self.proc = subprocess.Popen([sys.executable, "-m", "kernels_eval.worker"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=self.log, env=env, cwd=str(PACKAGE_ROOT),
                                 start_new_session=True)
    self.jobs = 0
    try:
      self.proc.stdin.write(wire.encode(config))
      self.proc.stdin.flush()
      ready = wire.decode_payload(self._read_frame_bytes(time.monotonic() + STARTUP_TIMEOUT_S))
      if ready.get("kind") != "ready":
        raise WorkerDied(f"worker sent {ready!r} instead of ready")
    except (WorkerDied, wire.WireError, OSError) as e:
      self.close()
      raise WorkerDied(f"worker failed to start ({e}); see {log_path}") from e
    self.toolchain = ready["toolchain"]
    self.startup_s = time.monotonic() - start

  def _read(self, n: int, deadline: float) -> bytes:
    fd, out = self.proc.stdout.fileno(), bytearray()
    while len(out) < n:
      left = deadline - time.monotonic()
      if left <= 0:
        raise WorkerDied("worker did not answer in time")
      ready, _, _ = select.select([fd], [], [], left)
      if ready:
        chunk = os.read(fd, min(n - len(out), 1 << 20))
        if not chunk:
          raise WorkerDied(f"worker exited (code {self.proc.poll()})")
        out += chunk
    return bytes(out)

  def _read_frame_bytes(self, deadline: float) -> bytes:
    n = int.from_bytes(self._read(4, deadline), "big")
    if n > wire.MAX_FRAME_BYTES:
      raise WorkerDied(f"worker frame of {n} bytes")
    return self._read(n, deadline)

  def run(self, runner: str, payload: dict[str, Any], timeout_s: float) -> JobOutcome:
    self.jobs += 1
    try:
      self.proc.stdin.write(wire.encode({"runner": runner, "timeout_s": timeout_s, "payload": payload}))
      self.proc.stdin.flush()
    except (BrokenPipeError, OSError) as e:
      raise WorkerDied(f"worker stdin closed: {e}") from e
    deadline = time.monotonic() + timeout_s + WORKER_SLACK_S
    header = wire.decode_payload(self._read_frame_bytes(deadline))
    data = self._read(int(header.pop("nbytes")), deadline)
    header.pop("kind", None)
    try:
      messages, complete = wire.split_frames(data)
    except wire.WireError as e:
      messages, complete = [], False
      header["truncated"] = True
      data = str(e).encode()
    return JobOutcome(messages=messages, complete=complete, toolchain=dict(self.toolchain), **header)

  def close(self) -> None:
    try:
      os.killpg(self.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
    self.proc.wait()
    for stream in (self.proc.stdin, self.proc.stdout):
      stream.close()
    self.log.close()


class WorkerPool:
  """`submit(runner, payload, timeout_s) -> Future[JobOutcome]`; at most `workers` jobs run at once."""

  def __init__(self, runners: dict[str, str], *, workers: int = 2, max_jobs: int = 200,
               limits: sandbox.Limits | None = None, platform: str | None = None,
               compile_cache_dir: str | os.PathLike | None = None):
    if workers < 1:
      raise ValueError(f"workers={workers} must be >= 1")
    self.platform = platform or ("cuda" if has_gpu() else "cpu")
    if limits is None:
      limits = sandbox.Limits(address_space_limit=self.platform == "cpu")
    self.tmp_root = tempfile.mkdtemp(prefix="kernels_eval-")
    os.chmod(self.tmp_root, 0o711)
    self.compile_cache_dir = None
    if compile_cache_dir is not None:
      self.compile_cache_dir = str(pathlib.Path(compile_cache_dir).resolve())
      os.makedirs(self.compile_cache_dir, exist_ok=True)
      if os.geteuid() == 0:
        os.chown(self.compile_cache_dir, limits.uid, limits.gid)
    self.config = {"runners": dict(runners), "limits": dataclasses.asdict(limits), "tmp_root": self.tmp_root}
    self.env = self._worker_env()
    self.max_jobs = max_jobs
    self.size = workers
    self._idle: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
    for _ in range(workers):
      self._idle.put(None)
    self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers,
                                                           thread_name_prefix="kernels_eval")
    self._lock = threading.Lock()
    self._all: set[_Worker] = set()
    self.workers_started = 0
    self._closed = False

  def _worker_env(self) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAX_", "XLA_", "TF_CPP")) and k not in ("PYTHONPATH",)}
    env.update(PYTHONPATH=str(PACKAGE_ROOT), XLA_PYTHON_CLIENT_PREALLOCATE="false", TF_CPP_MIN_LOG_LEVEL="3",
               JAX_PLATFORMS="cpu" if self.platform == "cpu" else "cuda,cpu", PYTHONDONTWRITEBYTECODE="1")
    if self.platform == "cpu":
      env["XLA_FLAGS"] = CPU_XLA_FLAGS
    if self.compile_cache_dir:
      env.update(JAX_COMPILATION_CACHE_DIR=self.compile_cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return env

  def _new_worker(self) -> _Worker:
    worker = _Worker(self.config, self.env, os.path.join(self.tmp_root, "worker.log"))
    with self._lock:
      self._all.add(worker)
      self.workers_started += 1
    return worker

  def _retire(self, worker: _Worker) -> None:
    with self._lock:
      self._all.discard(worker)
    worker.close()

  def _run(self, runner: str, payload: dict[str, Any], timeout_s: float) -> JobOutcome:
    worker = self._idle.get()
    cold = 0.0
    try:
      if worker is None:
        worker = self._new_worker()
        cold = worker.startup_s
      outcome = worker.run(runner, payload, timeout_s)
      outcome.cold_start_s = cold
    except (WorkerDied, wire.WireError, OSError) as e:
      if worker is not None:
        self._retire(worker)
      self._idle.put(None)
      return JobOutcome(messages=[], complete=False, infra_error=f"worker failed: {e}")
    if worker.jobs >= self.max_jobs or worker.proc.poll() is not None:
      self._retire(worker)
      worker = None
    self._idle.put(worker)
    return outcome

  def submit(self, runner: str, payload: dict[str, Any], timeout_s: float) -> concurrent.futures.Future:
    if self._closed:
      raise RuntimeError("the worker pool is closed")
    return self._executor.submit(self._run, runner, payload, timeout_s)

  def warm_up(self) -> None:
    """Starts every worker now (otherwise each starts on its first job)."""
    taken = [self._idle.get() for _ in range(self.size)]
    taken = [w if w is not None else self._new_worker() for w in taken]
    for w in taken:
      self._idle.put(w)

  def close(self) -> None:
    self._closed = True
    self._executor.shutdown(wait=True)
    with self._lock:
      workers = list(self._all)
    for w in workers:
      self._retire(w)
    shutil.rmtree(self.tmp_root, ignore_errors=True)

  def __enter__(self) -> "WorkerPool":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
