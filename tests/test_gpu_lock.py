"""The GPU lock: a timing excludes every other job's GPU work, checks share, a dead holder frees it, and a
jailed child inherits it from its worker."""
import fcntl
import multiprocessing
import os
import time

import pytest

from kernels_eval import gpu_lock
from kernels_eval import sandbox
from kernels_eval import wire
from kernels_eval import worker


@pytest.fixture
def lock_env(tmp_path, monkeypatch):
  fds = gpu_lock.open_fds(tmp_path)
  monkeypatch.setenv(gpu_lock.FDS_ENV, ",".join(map(str, fds)))
  yield tmp_path
  for fd in fds:
    os.close(fd)


def _holds(kind: str, ready, release) -> None:
  with (gpu_lock.exclusive() if kind == "exclusive" else gpu_lock.shared()):
    ready.set()
    release.wait(30)


def _try(folder, operation: int) -> bool:
  """Whether another process could take the main lock now (a fresh descriptor, so a fresh lock owner)."""
  def attempt(q):
    fd = os.open(folder / "main", os.O_RDWR)
    try:
      fcntl.lockf(fd, operation | fcntl.LOCK_NB)
      q.put(True)
    except OSError:
      q.put(False)
  q = multiprocessing.get_context("fork").Queue()
  p = multiprocessing.get_context("fork").Process(target=attempt, args=(q,))
  p.start()
  p.join(10)
  return q.get(timeout=5)


@pytest.mark.parametrize("kind,shared_ok,exclusive_ok", [("exclusive", False, False), ("shared", True, False)])
def test_exclusive_excludes_everything_and_shared_only_timings(lock_env, kind, shared_ok, exclusive_ok):
  ctx = multiprocessing.get_context("fork")
  ready, release = ctx.Event(), ctx.Event()
  holder = ctx.Process(target=_holds, args=(kind, ready, release))
  holder.start()
  assert ready.wait(10)
  assert _try(lock_env, fcntl.LOCK_SH) is shared_ok
  assert _try(lock_env, fcntl.LOCK_EX) is exclusive_ok
  release.set()
  holder.join(10)
  assert _try(lock_env, fcntl.LOCK_EX)


def test_a_killed_holder_frees_the_lock(lock_env):
  ctx = multiprocessing.get_context("fork")
  ready, release = ctx.Event(), ctx.Event()
  holder = ctx.Process(target=_holds, args=("exclusive", ready, release))
  holder.start()
  assert ready.wait(10) and not _try(lock_env, fcntl.LOCK_SH)
  holder.kill()
  holder.join(10)
  assert _try(lock_env, fcntl.LOCK_EX)


def test_without_the_variable_the_lock_does_nothing(monkeypatch):
  monkeypatch.delenv(gpu_lock.FDS_ENV, raising=False)
  with gpu_lock.exclusive(), gpu_lock.exclusive():
    pass


@pytest.mark.parametrize("isolation", sandbox.ISOLATIONS)
def test_a_sandboxed_child_holds_the_workers_lock(tmp_path, isolation):
  """The descriptors cross into the jail by number: while the child times, no one else gets the lock, and
  it is free once the child is gone."""
  fds = gpu_lock.open_fds(tmp_path)
  env = ((gpu_lock.FDS_ENV, ",".join(map(str, fds))),)
  view = sandbox.View(readable=tuple(worker._readable_roots()), env=env)  # pylint: disable=protected-access

  def job(emit, tmpdir):
    del tmpdir
    with gpu_lock.exclusive():
      emit({"kind": "locked"})
      time.sleep(4)

  def watch(q):
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
      if not _try(tmp_path, fcntl.LOCK_SH):
        q.put(True)
        return
      time.sleep(0.1)
    q.put(False)
  ctx = multiprocessing.get_context("fork")
  q = ctx.Queue()
  watcher = ctx.Process(target=watch, args=(q,))
  watcher.start()
  limits = sandbox.Limits(isolation=isolation, address_space_limit=False)
  outcome = sandbox.run_sandboxed(job, 30, limits, view, str(tmp_path), keep_fds=fds)
  watcher.join(20)
  messages, problem = wire.split_frames(outcome.data)
  assert problem is None and messages == [{"kind": "locked"}], (messages, outcome.header())
  assert q.get(timeout=5) is True
  assert _try(tmp_path, fcntl.LOCK_EX)
  for fd in fds:
    os.close(fd)
