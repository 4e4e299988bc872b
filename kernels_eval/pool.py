"""A pool of warm workers (`kernels_eval.worker`), driven from the parent without importing JAX.

Each worker process imports JAX once and forks a sandboxed child per job step. The pool hands jobs to idle
workers from a thread per slot, and replaces a worker after `max_jobs` jobs, after it stops answering or
sends something it should not (an infrastructure failure: the job is retried by the caller, never judged)
or when it exits. Child crashes and timeouts are the child's: the worker survives them. Whatever goes
wrong while reading a job's result, the slot comes back and the job gets an outcome.

Isolation (`sandbox.Limits.isolation`): "namespaces" unless opted out. The pool checks that this machine
can set up a jail before it takes any job and raises `jail.IsolationUnavailable`, naming what is missing,
when it cannot; a worker's first act is a jailed self-test (every module it imported must be readable
from inside). When the pool runs as root, each worker slot's jobs run as a uid of their own, drawn from a
random block per pool, so that no job shares a process count with a job of another slot or pool.

Worker environment: an allowlist of the parent's (no secrets); single-threaded XLA on CPU; on a GPU no memory
preallocation and a device-memory cap per job (`sandbox.Limits.gpu_memory_bytes`, as JAX's allocator
fraction); no persistent compilation cache unless `compile_cache_dir` is given. That cache is opt-in
(CI, trusted candidates): children write it through JAX, so a shared cache written by processes that ran
untrusted code is a trust decision.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import pathlib
import queue
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Sequence

from kernels_eval import jail
from kernels_eval import sandbox
from kernels_eval import wire

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[1]
CPU_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
STARTUP_TIMEOUT_S = 120.0
SLOTS_PER_POOL = 256   # uids per pool: one per worker slot, from a random block of `sandbox.Limits.uid + ...`
WORKER_SLACK_S = 30.0
# The parent's variables a worker and its jobs may see; nothing else (no secret) crosses.
ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "CUDA_HOME", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
                 "LD_LIBRARY_PATH", "XLA_PYTHON_CLIENT_MEM_FRACTION", "KERNELS_EVAL_CACHE_DIR", "KERNELS_EVAL_NVCC",
                 "KERNELS_EVAL_CUDA_ARCH", "KERNELS_EVAL_GPU_ARCHS", "KERNELS_EVAL_CUDA_SANITIZER",
                 "KERNELS_EVAL_CUDA_CHECK_TIMEOUT_S")
JOB_ENV_EXTRA = ("PYTHONPATH", "XLA_FLAGS", "JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE", "TF_CPP_MIN_LOG_LEVEL",
                 "PYTHONDONTWRITEBYTECODE", "JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                 "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES")


def has_gpu() -> bool:
  """True when an NVIDIA device node exists (checked without importing JAX)."""
  return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


@functools.lru_cache(maxsize=None)
def gpu_memory_total_bytes() -> int | None:
  """Total memory of the first visible GPU according to nvidia-smi (once per process), or None."""
  smi = shutil.which("nvidia-smi")
  if smi is None:
    return None
  try:
    out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return int(float(out.split()[0])) << 20
  except (OSError, subprocess.SubprocessError, ValueError, IndexError):
    return None


def job_memory_fraction(limit_bytes: int, total_bytes: int | None) -> str | None:
  """`XLA_PYTHON_CLIENT_MEM_FRACTION` capping a job at `limit_bytes`: below any fraction the parent set."""
  if not total_bytes:
    return None
  fraction = min(1.0, limit_bytes / total_bytes)
  inherited = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
  if inherited:
    fraction = min(fraction, float(inherited))
  return f"{fraction:.4f}"


@dataclasses.dataclass
class StepOutcome:
  """One step's child as seen by the parent: its decoded frames and how it ended."""
  messages: list[dict[str, Any]]
  exit_code: int | None = None
  signal: int | None = None
  timed_out: bool = False
  memory_killed: bool = False
  truncated: bool = False
  wall_s: float = 0.0
  decode_error: str | None = None


@dataclasses.dataclass
class JobOutcome:
  """One job: its steps by runner name. `infra_error` is set when the worker, not a child, failed."""
  steps: dict[str, StepOutcome] = dataclasses.field(default_factory=dict)
  infra_error: str | None = None
  toolchain: dict[str, str] = dataclasses.field(default_factory=dict)
  cold_start_s: float = 0.0

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "JobOutcome":
    return cls(**{**d, "steps": {k: StepOutcome(**v) for k, v in d.get("steps", {}).items()}})


class WorkerDied(RuntimeError):
  pass


def _decode_step(header: dict[str, Any], data: bytes) -> StepOutcome:
  """A step's frames: those before any undecodable, oversized or cut-off one, and what was wrong."""
  fields = {k: header.get(k) for k in ("exit_code", "signal", "wall_s")}
  flags = {k: bool(header.get(k)) for k in ("timed_out", "memory_killed", "truncated")}
  messages, problem = wire.split_frames(data)
  return StepOutcome(messages=messages, decode_error=problem, **flags,
                     **{k: v for k, v in fields.items() if v is not None})


class _Worker:
  """One worker process and its protocol pipes."""

  def __init__(self, config: dict[str, Any], env: dict[str, str], log_path: str, python: str):
    self.log = open(log_path, "ab")  # noqa: SIM115  (lives as long as the worker)
    start = time.monotonic()
    self.proc = subprocess.Popen([python, "-m", "kernels_eval.worker"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=self.log, env=env, cwd=config["package_root"],
                                 start_new_session=True)
    self.jobs = 0
    try:
      self.proc.stdin.write(wire.encode(config))
      self.proc.stdin.flush()
      ready = wire.decode_payload(self._read_frame_bytes(time.monotonic() + STARTUP_TIMEOUT_S))
      if not isinstance(ready, dict) or ready.get("kind") != "ready":
        raise WorkerDied(f"worker sent {ready!r} instead of ready")
    except (WorkerDied, wire.WireError, OSError) as e:
      self.close()
      raise WorkerDied(f"worker failed to start ({e}); see {log_path}") from e
    if ready.get("isolation_error"):
      self.close()
      raise jail.IsolationUnavailable(ready["isolation_error"])
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

  def run(self, steps: Sequence[str], payload: dict[str, Any], timeout_s: float) -> JobOutcome:
    self.jobs += 1
    try:
      self.proc.stdin.write(wire.encode({"steps": list(steps), "timeout_s": timeout_s, "payload": payload}))
      self.proc.stdin.flush()
    except (BrokenPipeError, OSError) as e:
      raise WorkerDied(f"worker stdin closed: {e}") from e
    deadline = time.monotonic() + timeout_s + WORKER_SLACK_S
    outcome = JobOutcome(toolchain=dict(self.toolchain))
    for _ in range(len(steps) + 1):
      header = wire.decode_payload(self._read_frame_bytes(deadline))
      if isinstance(header, dict) and header.get("kind") == "end":
        return outcome
      if not (isinstance(header, dict) and header.get("kind") == "step" and isinstance(header.get("nbytes"), int)):
        raise WorkerDied(f"worker sent a malformed step header: {str(header)[:200]}")
      outcome.steps[str(header.get("runner"))] = _decode_step(header, self._read(header["nbytes"], deadline))
    raise WorkerDied("worker sent more steps than the job has")

  def close(self) -> None:
    try:
      os.killpg(self.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
    self.proc.wait()
    for stream in (self.proc.stdin, self.proc.stdout):
      try:
        stream.close()
      except OSError:
        pass
    self.log.close()


def worker_env(platform: str, compile_cache_dir: str | None, package_root: str) -> dict[str, str]:
  """The environment of a worker (and, through `JOB_ENV_EXTRA`, of its jobs): an allowlist."""
  env = {k: v for k, v in os.environ.items() if k in ENV_ALLOWLIST}
  flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                   if "xla_force_host_platform_device_count" not in f)
  paths = [package_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
  env.update(PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)), XLA_PYTHON_CLIENT_PREALLOCATE="false",
             TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu" if platform == "cpu" else "cuda,cpu",
             PYTHONDONTWRITEBYTECODE="1", HOME=os.environ.get("HOME", tempfile.gettempdir()))
  env.setdefault("PATH", "/usr/bin:/bin")
  if platform == "cpu":
    flags = f"{flags} {CPU_XLA_FLAGS}".strip()
  if flags:
    env["XLA_FLAGS"] = flags
  if compile_cache_dir:
    env.update(JAX_COMPILATION_CACHE_DIR=compile_cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  return env


class WorkerPool:
  """`submit(steps, payload, timeout_s) -> Future[JobOutcome]`; at most `workers` jobs run at once.

  `steps`: runner names run one after the other, each in its own sandboxed child, on the same payload.
  `python` / `package_root`: the interpreter and checkout the workers run from (default: this one's).
  `isolation`: overrides `limits.isolation` ("namespaces", or the "process" opt-out).
  """

  def __init__(self, runners: dict[str, str], *, workers: int = 2, max_jobs: int = 200,
               limits: sandbox.Limits | None = None, platform: str | None = None,
               compile_cache_dir: str | os.PathLike | None = None, python: str | None = None,
               package_root: str | os.PathLike | None = None, isolation: str | None = None):
    if not 1 <= workers <= SLOTS_PER_POOL:
      raise ValueError(f"workers={workers} must be in 1..{SLOTS_PER_POOL}")
    self.platform = platform or ("cuda" if has_gpu() else "cpu")
    self.limits = limits or sandbox.Limits(address_space_limit=self.platform == "cpu")
    if isolation is not None:
      self.limits = dataclasses.replace(self.limits, isolation=isolation)
    if self.limits.isolation == "namespaces":
      problem = jail.probe()
      if problem is not None:
        raise jail.IsolationUnavailable(
            f"{problem}. The evaluator refuses untrusted code without kernel-level isolation; to accept the "
            "weaker process sandbox on this machine, pass sandbox.Limits(isolation='process') (config: "
            "evaluator.isolation='process').")
    self.tmp_root = tempfile.mkdtemp(prefix="kernels_eval-")
    os.chmod(self.tmp_root, 0o711)
    self.compile_cache_dir = self._shared_cache(compile_cache_dir)
    # Each slot's jobs run as their own uid, from a block no other pool on this machine is likely to hold, so
    # that process limits (counted per uid) of one job never bind another's.
    self.uid_base = self.limits.uid + secrets.randbelow(1 << 20) * SLOTS_PER_POOL
    self.python = python or sys.executable
    self.config = {"runners": dict(runners), "tmp_root": self.tmp_root,
                   "package_root": str(package_root or PACKAGE_ROOT),
                   "writable": [self.compile_cache_dir] if self.compile_cache_dir else []}
    self.env = worker_env(self.platform, self.compile_cache_dir, self.config["package_root"])
    if self.platform != "cpu":
      fraction = job_memory_fraction(self.limits.gpu_memory_bytes, gpu_memory_total_bytes())
      if fraction is not None:
        self.env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = fraction
    self.config["job_env"] = {k: v for k, v in self.env.items() if k in ENV_ALLOWLIST + JOB_ENV_EXTRA}
    self.max_jobs = max_jobs
    self.size = workers
    self._idle: queue.SimpleQueue[tuple[int, _Worker | None]] = queue.SimpleQueue()
    for slot in range(workers):
      self._idle.put((slot, None))
    self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kernels_eval")
    self._lock = threading.Lock()
    self._all: set[_Worker] = set()
    self.workers_started = 0
    self.fatal: str | None = None
    self._closed = False

  def _shared_cache(self, folder: str | os.PathLike | None) -> str | None:
    """The opt-in JAX cache, writable by every slot's uid through the jobs' shared group."""
    if folder is None:
      return None
    path = str(pathlib.Path(folder).resolve())
    os.makedirs(path, exist_ok=True)
    if os.geteuid() == 0:
      os.chown(path, -1, self.limits.gid)
      os.chmod(path, 0o2775 if self.limits.isolation == "namespaces" else 0o777)
    return path

  def _new_worker(self, slot: int) -> _Worker:
    """Starts the worker of `slot`; a worker that cannot isolate its jobs makes the pool refuse all jobs."""
    limits = dataclasses.replace(self.limits, uid=self.uid_base + slot)
    config = {**self.config, "limits": dataclasses.asdict(limits)}
    try:
      worker = _Worker(config, self.env, os.path.join(self.tmp_root, "worker.log"), self.python)
    except jail.IsolationUnavailable as e:
      self.fatal = f"sandbox unavailable: {e}"
      raise
    with self._lock:
      self._all.add(worker)
      self.workers_started += 1
    return worker

  def _retire(self, worker: _Worker) -> None:
    with self._lock:
      self._all.discard(worker)
    worker.close()

  def _run(self, steps: Sequence[str], payload: dict[str, Any], timeout_s: float) -> JobOutcome:
    slot, worker = self._idle.get()
    cold = 0.0
    try:
      if self.fatal:
        return JobOutcome(infra_error=self.fatal)
      if worker is None:
        worker = self._new_worker(slot)
        cold = worker.startup_s
      outcome = worker.run(steps, payload, timeout_s)
      outcome.cold_start_s = cold
    except jail.IsolationUnavailable:
      return JobOutcome(infra_error=self.fatal)
    except BaseException as e:  # noqa: BLE001  (any failure here is the worker's: retire it, keep the slot)
      if worker is not None:
        self._retire(worker)
      worker = None
      return JobOutcome(infra_error=f"worker failed: {e!r}"[:2000])
    finally:
      if worker is not None and (worker.jobs >= self.max_jobs or worker.proc.poll() is not None):
        self._retire(worker)
        worker = None
      self._idle.put((slot, worker))
    return outcome

  def submit(self, steps: str | Sequence[str], payload: dict[str, Any],
             timeout_s: float) -> concurrent.futures.Future:
    if self._closed:
      raise RuntimeError("the worker pool is closed")
    if self.fatal:
      raise jail.IsolationUnavailable(self.fatal)
    steps = [steps] if isinstance(steps, str) else list(steps)
    return self._executor.submit(self._run, steps, payload, timeout_s)

  def warm_up(self, count: int | None = None) -> None:
    """Starts `count` (default: every) worker now; raises IsolationUnavailable if their jobs cannot be
    isolated (otherwise each worker starts on its first job)."""
    taken = [self._idle.get() for _ in range(self.size)]
    try:
      for i, (slot, worker) in enumerate(taken):
        if worker is None and (count is None or i < count):
          taken[i] = (slot, self._new_worker(slot))
    finally:
      for item in taken:
        self._idle.put(item)

  def close(self) -> None:
    self._closed = True
    self._executor.shutdown(wait=True)
    with self._lock:
      workers = list(self._all)
    for w in workers:
      self._retire(w)
    sandbox.remove_tree(self.tmp_root)

  def __enter__(self) -> "WorkerPool":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
