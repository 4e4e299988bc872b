"""CPU tests of what a GPU host changes: per-job device memory, output caps that scale with the task, the
number of kept timing outputs, the corpus's expectations of a GPU run."""
import concurrent.futures
import math
import os
import stat

import numpy as np
import pytest

from kernels_eval import pool as pool_lib
from kernels_eval import sandbox
from kernels_eval import task as task_lib
from kernels_eval import timing
from kernels_eval import wire
from kernels_eval import worker
from kernels_eval.hardening import corpus
from kernels_eval.hardening import pallas_cases


def _fake_smi(folder, mib: str):
  script = folder / "nvidia-smi"
  script.write_text(f"#!/bin/sh\necho \"$@\" >> {folder}/calls\necho {mib}\n")
  script.chmod(script.stat().st_mode | stat.S_IEXEC)
  return folder / "calls"


def test_each_job_gets_a_device_memory_cap(tmp_path, monkeypatch):
  calls = _fake_smi(tmp_path, "143771")
  monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  pool_lib.gpu_memory_total_bytes.cache_clear()
  try:
    total = pool_lib.gpu_memory_total_bytes()
    assert total == 143771 << 20 and pool_lib.gpu_memory_total_bytes() == total
    assert len(calls.read_text().splitlines()) == 1  # asked once per process
  finally:
    pool_lib.gpu_memory_total_bytes.cache_clear()
  assert float(pool_lib.job_memory_fraction(8 << 30, total)) * total >= (8 << 30) * 0.999
  assert float(pool_lib.job_memory_fraction(8 << 30, total)) < 0.06
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.01")
  assert pool_lib.job_memory_fraction(8 << 30, total) == "0.0100"  # a lower cap set by the user wins
  assert pool_lib.job_memory_fraction(8 << 30, None) is None


def test_a_candidate_may_send_twice_the_reference_not_a_fixed_128_mib():
  """At timing size a 64 MiB output is ~85 MiB of frames: the cap follows the reference's frames."""
  out = np.zeros((4096, 4096), np.float32)
  reference_frames = len(wire.encode({"kind": "timing_reference", "output": out, "reference_ms": 1.0}))
  candidate_frames = len(wire.encode({"kind": "timing_output", "output": out}))
  assert reference_frames > 80 << 20
  assert candidate_frames <= worker.later_step_cap(reference_frames)
  assert worker.later_step_cap(0) == 1 << 20


def test_kept_timing_outputs_stay_under_the_budget():
  assert timing.calls_per_round(4) == timing.CALLS
  big = 1 << 30
  n = timing.calls_per_round(big)
  assert n == 2 or n * timing.ROUNDS * big <= timing.KEEP_BYTES


def test_a_correct_pallas_case_may_end_at_timing_on_a_gpu():
  case = next(c for c in corpus.all_cases() if c.name == "pallas_correct_baseline")

  class Result:  # pylint: disable=too-few-public-methods
    status, stage, rejected_reason, flags, feedback, infra_error = "correct", "timing", None, [], "", None
  assert corpus.judge(case, Result(), gpu=True)[0]
  huge = next(c for c in pallas_cases.CASES if c.name == "huge_allocation")
  assert "(1 << 32,)" in huge.source  # 16 GiB: over a job's device-memory cap as well as its address space


def _many_threads(count: int):
  def job(emit, tmpdir):
    del tmpdir
    import threading  # pylint: disable=import-outside-toplevel
    release = threading.Event()
    threads = [threading.Thread(target=release.wait, args=(30,)) for _ in range(count)]
    started = 0
    try:
      for t in threads:
        t.start()
        started += 1
    finally:
      release.set()
    emit({"kind": "threads", "started": started})
  return job


@pytest.mark.skipif(os.geteuid() != 0, reason="per-slot uids are set up by root")
def test_jobs_of_two_slots_do_not_share_a_process_limit():
  """A JAX child on a 16-core host runs ~100 threads; two slots' jobs running 300 threads each at once would
  pass a shared 512-process limit, but each slot's jobs run as a uid of their own."""
  base = sandbox.Limits().uid + 12345 * pool_lib.SLOTS_PER_POOL
  jobs = [(_many_threads(300), sandbox.Limits(uid=base + slot, address_space_limit=False)) for slot in (0, 1)]
  with concurrent.futures.ThreadPoolExecutor(2) as ex:
    outcomes = list(ex.map(lambda j: sandbox.run_sandboxed(j[0], 60, j[1]), jobs))
  for outcome in outcomes:
    messages, problem = wire.split_frames(outcome.data)
    assert problem is None and messages == [{"kind": "threads", "started": 300}], outcome.header()


def test_every_embedded_tasks_timing_files_fit_the_default_file_limit():
  """The CUDA harness writes each timing input and output as a file under the job's file-size limit."""
  import jax  # pylint: disable=import-outside-toplevel
  from kernels_eval import reference_runner  # pylint: disable=import-outside-toplevel
  largest = 0
  for task in task_lib.load_tasks():
    shapes = [jax.ShapeDtypeStruct(s.concrete_shape(task.timing_dims), s.dtype) for s in task.inputs]
    out = jax.eval_shape(reference_runner.load_reference(task.to_job()), *shapes)
    largest = max([largest] + [math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in [*shapes, out]])
  assert 64 << 20 < largest <= sandbox.Limits().file_bytes


def test_workers_keep_carried_packages_and_xla_flags_but_no_secrets(monkeypatch):
  """Wheels carried onto a GPU host through PYTHONPATH and the user's XLA_FLAGS reach the workers; the fake
  CPU device count and everything off the allowlist do not."""
  monkeypatch.setenv("PYTHONPATH", "/opt/wheels")
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_autotune_level=0 --xla_force_host_platform_device_count=8")
  monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
  env = pool_lib.worker_env("cuda", None, "/src")
  assert env["PYTHONPATH"].split(os.pathsep) == ["/src", "/opt/wheels"]
  assert env["XLA_FLAGS"] == "--xla_gpu_autotune_level=0" and env["JAX_PLATFORMS"] == "cuda,cpu"
  assert "AWS_SECRET_ACCESS_KEY" not in env
