"""One timing measurement on a GPU at a time, across every worker of every pool on the machine.

A readers-writer lock over two lock files. A job step holds it *shared* while it runs code on the GPU
(a reference, a correctness check) and *exclusive* while it times, so a timing never overlaps another
job's GPU work. Writers first take a turnstile, which a reader also passes through, so a waiting timing is
not starved by a stream of checks. The locks are POSIX record locks (`fcntl.lockf`): they belong to the
process that took them and are released by the kernel when it dies, so a killed job never leaves the GPU
locked.

The worker opens both files once (`open_fds`) and its sandboxed children inherit the descriptors, named
in the environment variable `FDS_ENV` ("turnstile,main"); a jailed child needs no path. Without that
variable (no GPU, or a caller outside a pool) both context managers do nothing.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import tempfile
from typing import Iterator

FDS_ENV = "KERNELS_EVAL_GPU_LOCK_FDS"
DIR_ENV = "KERNELS_EVAL_GPU_LOCK_DIR"


def lock_dir() -> pathlib.Path:
  """$KERNELS_EVAL_GPU_LOCK_DIR, else one folder per machine under the system temp dir."""
  return pathlib.Path(os.environ.get(DIR_ENV) or os.path.join(tempfile.gettempdir(), "kernels_eval-gpu-lock"))


def open_fds(folder: str | os.PathLike | None = None) -> tuple[int, int]:
  """Opens (creating) the turnstile and main lock files; the caller keeps both open for its lifetime."""
  folder = pathlib.Path(folder or lock_dir())
  folder.mkdir(mode=0o1777, parents=True, exist_ok=True)
  fds = []
  for name in ("turnstile", "main"):
    fd = os.open(folder / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    os.set_inheritable(fd, True)
    fds.append(fd)
  return fds[0], fds[1]


def _fds() -> tuple[int, int] | None:
  value = os.environ.get(FDS_ENV)
  if not value:
    return None
  turnstile, main = (int(x) for x in value.split(","))
  return turnstile, main


def _acquire(mode: int) -> tuple[int, int] | None:
  """Passes the turnstile and takes the main lock in `mode`; a reader leaves the turnstile at once, a timing
  keeps it until it is done."""
  fds = _fds()
  if fds is None:
    return None
  turnstile, main = fds
  fcntl.lockf(turnstile, fcntl.LOCK_EX)
  try:
    fcntl.lockf(main, mode)
  except BaseException:
    fcntl.lockf(turnstile, fcntl.LOCK_UN)
    raise
  if mode == fcntl.LOCK_SH:
    fcntl.lockf(turnstile, fcntl.LOCK_UN)
  return fds


def _release(fds: tuple[int, int] | None) -> None:
  if fds is not None:
    for fd in reversed(fds):  # unlocking what this process does not hold is a no-op
      fcntl.lockf(fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def _held(mode: int) -> Iterator[None]:
  fds = _acquire(mode)
  try:
    yield
  finally:
    _release(fds)


def shared() -> contextlib.AbstractContextManager[None]:
  """Held while a step runs code on the GPU that is not a timing. Never nest the two."""
  return _held(fcntl.LOCK_SH)


def exclusive() -> contextlib.AbstractContextManager[None]:
  """Held while a step times: no other job's code runs on the GPU meanwhile."""
  return _held(fcntl.LOCK_EX)
