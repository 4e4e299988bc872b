"""Ray executor: the evaluator's jobs on Ray actors instead of local worker processes.

`RayPool` has the interface of `pool.WorkerPool` (`submit(runner, payload, timeout_s)` -> Future of a
`JobOutcome`, `platform`, `close()`), so `Evaluator(executor="ray", address=...)` builds the same
payloads (same seeds for the same request ids) and makes the same verdicts in the parent; only where the
job runs changes. Each actor (`_Host`) holds a one-worker `WorkerPool` on its node: the job still runs
in a fresh sandboxed child there, and Ray only carries payloads and outcomes that the node's worker
has already decoded with the wire format.

Actors: `gpu_hosts` declare one GPU each (default: one per GPU in the cluster) and take the jobs that
run code; `cpu_hosts` declare one CPU each and take compile-only jobs (`stages == "compile"`), and all
jobs when the cluster has no GPU. A host whose actor dies is replaced; its job returns an
`infra_error` (never a verdict on the candidate).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import queue
import threading
from typing import Any

import ray

from kernels_eval import pool as pool_lib
from kernels_eval import sandbox


@ray.remote
class _Host:
  """One node-local worker pool (one worker: the actor's resources are one job's)."""

  def __init__(self, runners: dict[str, str], limits: dict[str, Any] | None, platform: str, max_jobs: int):
    self.pool = pool_lib.WorkerPool(runners, workers=1, max_jobs=max_jobs,
                                    limits=sandbox.Limits(**limits) if limits else None, platform=platform)

  def run(self, steps: list[str], payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    return dataclasses.asdict(self.pool.submit(steps, payload, timeout_s).result())

  def close(self) -> None:
    self.pool.close()


class _Hosts:
  """Idle actors of one kind, handed out one job at a time."""

  def __init__(self, make, count: int):
    self.make = make
    self.idle: queue.SimpleQueue = queue.SimpleQueue()
    self.all = [make() for _ in range(count)]
    for h in self.all:
      self.idle.put(h)

  def replace(self, dead) -> None:
    fresh = self.make()
    self.all = [fresh if h is dead else h for h in self.all]
    self.idle.put(fresh)


class RayPool:
  """Evaluator jobs on Ray actors.

  Args:
    runners: name -> "module:function", as for `WorkerPool`.
    address: Ray cluster address; None connects to the running instance (or starts a local one).
    cpu_workers: CPU actors (compile-only jobs; every job without GPUs).
    gpu_workers: GPU actors; None = one per GPU in the cluster.
    limits: sandbox limits for the workers (None: the `WorkerPool` defaults of each node).
  """

  def __init__(self, runners: dict[str, str], *, address: str | None = None, cpu_workers: int = 2,
               gpu_workers: int | None = None, limits: sandbox.Limits | None = None, max_jobs: int = 200):
    if not ray.is_initialized():
      ray.init(address=address, include_dashboard=False, log_to_driver=False)
    if gpu_workers is None:
      gpu_workers = int(ray.cluster_resources().get("GPU", 0))
    if cpu_workers < 1 and gpu_workers < 1:
      raise ValueError("RayPool needs at least one CPU or GPU worker")
    limit_args = dataclasses.asdict(limits) if limits else None
    self._cpu = _Hosts(lambda: _Host.options(num_cpus=1).remote(runners, limit_args, "cpu", max_jobs), cpu_workers)
    self._gpu = _Hosts(lambda: _Host.options(num_cpus=1, num_gpus=1).remote(runners, limit_args, "cuda",
                                                                            max_jobs), gpu_workers)
    self.platform = "cuda" if gpu_workers else "cpu"
    self.size = cpu_workers + gpu_workers
    self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=self.size, thread_name_prefix="ray_eval")
    self._lock = threading.Lock()
    self._closed = False

  def _hosts_for(self, payload: dict[str, Any]) -> _Hosts:
    if not self._gpu.all or (payload.get("stages") == "compile" and self._cpu.all):
      return self._cpu
    return self._gpu

  def _run(self, steps: list[str], payload: dict[str, Any], timeout_s: float) -> pool_lib.JobOutcome:
    hosts = self._hosts_for(payload)
    host = hosts.idle.get()
    try:
      outcome = ray.get(host.run.remote(steps, payload, timeout_s), timeout=timeout_s + 2 * pool_lib.WORKER_SLACK_S)
    except (ray.exceptions.RayError, TimeoutError) as e:
      with self._lock:
        hosts.replace(host)
      ray.kill(host)
      return pool_lib.JobOutcome(infra_error=f"ray worker failed: {e}")
    hosts.idle.put(host)
    return pool_lib.JobOutcome.from_dict(outcome)

  def submit(self, steps: str | list[str], payload: dict[str, Any], timeout_s: float) -> concurrent.futures.Future:
    if self._closed:
      raise RuntimeError("the Ray pool is closed")
    steps = [steps] if isinstance(steps, str) else list(steps)
    return self._executor.submit(self._run, steps, payload, timeout_s)

  def close(self) -> None:
    self._closed = True
    self._executor.shutdown(wait=True)
    hosts = self._cpu.all + self._gpu.all
    ray.get([h.close.remote() for h in hosts])
    for h in hosts:
      ray.kill(h)
