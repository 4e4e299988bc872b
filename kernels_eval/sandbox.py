"""The sandbox every piece of untrusted code runs in: one forked child per job.

`run_sandboxed(target, timeout_s, limits)` forks; the child
  - calls setsid (its own process group, so the whole group can be killed),
  - leaves the network namespace (`unshare(CLONE_NEWNET)`: no interfaces but a down loopback),
  - gets rlimits: address space (CPU only: CUDA reserves large virtual ranges, so on GPU hosts the
    RSS watchdog below is the memory cap), CPU seconds, file size, no core dumps, open files, and
    RLIMIT_NPROC, which binds because the child then drops to an unprivileged uid/gid (`nobody`) with
    no supplementary groups, no new privileges, and SIGKILL when its parent dies,
  - works in a private temp dir (TMPDIR, HOME, cwd) owned by that uid, with stdin/stdout/stderr on
    /dev/null and every other inherited file descriptor closed except its result pipe.
The parent side reads the child's frames, kills the process group at the wall deadline or when its RSS
passes the memory cap, and removes the temp dir. When not started as root, the uid switch and the
network namespace are skipped and `SandboxReport` says so.

`lock_down(tmpdir)` is called by a runner right before it loads untrusted code: an audit hook that
refuses sockets, subprocesses, exec, fork, signals to other processes and file writes outside `tmpdir`.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import resource
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

from kernels_eval import wire

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
MAX_CHILD_OUTPUT = 128 << 20


@dataclasses.dataclass
class Limits:
  memory_bytes: int = 4 << 30
  nproc: int = 256
  cpu_seconds: int = 600
  file_bytes: int = 64 << 20
  open_files: int = 512
  uid: int = 65534
  gid: int = 65534
  address_space_limit: bool = True
  unshare_net: bool = True


@dataclasses.dataclass
class ChildOutcome:
  """What came back from one sandboxed child. `data` holds its raw frames."""
  data: bytes
  exit_code: int | None
  signal: int | None
  timed_out: bool
  memory_killed: bool
  truncated: bool
  wall_s: float

  def header(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d.pop("data")
    return d


def _libc():
  return ctypes.CDLL(None, use_errno=True)


def _enter(limits: Limits, tmpdir: str, keep_fd: int) -> None:
  """Runs in the child, as the forking user, before any job code."""
  os.setsid()
  libc = _libc()
  is_root = os.geteuid() == 0
  if limits.unshare_net and is_root and libc.unshare(CLONE_NEWNET) != 0:
    raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")
  if limits.address_space_limit:
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
  resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds))
  resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
  resource.setrlimit(resource.RLIMIT_NPROC, (limits.nproc, limits.nproc))
  devnull = os.open(os.devnull, os.O_RDWR)
  for fd in (0, 1, 2):
    os.dup2(devnull, fd)
  os.closerange(3, keep_fd)
  os.closerange(keep_fd + 1, 65536)
  os.environ.update(TMPDIR=tmpdir, HOME=tmpdir, TMP=tmpdir, TEMP=tmpdir)
  tempfile.tempdir = tmpdir
  os.chdir(tmpdir)
  if is_root:
    os.setgroups([])
    os.setgid(limits.gid)
    os.setuid(limits.uid)
  libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


_BLOCKED_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                   "os.forkpty", "os.kill", "os.killpg", "pty.spawn", "os.startfile", "sys.addaudithook",
                   "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata")
_PATH_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.truncate",
                "os.chown", "os.chmod", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def lock_down(tmpdir: str, *, allow_dlopen: bool = False) -> None:
  """Installs the audit hook (irreversible). `allow_dlopen` lets a runner load a compiled library.

  Writes are allowed under `tmpdir` and, when the worker was given one, JAX's compilation cache dir.
  """
  roots = tuple(os.path.realpath(d) + os.sep
                for d in (tmpdir, os.environ.get("JAX_COMPILATION_CACHE_DIR")) if d)
  blocked = tuple(e for e in _BLOCKED_EVENTS if not (allow_dlopen and e.startswith("ctypes")))

  def inside(path) -> bool:
    if isinstance(path, int):
      return True
    try:
      return os.path.realpath(os.fsdecode(path)).startswith(roots)
    except (TypeError, ValueError):
      return False

  def hook(event: str, args: tuple) -> None:
    if event.startswith("socket."):
      raise PermissionError(f"network access is not allowed in the sandbox ({event})")
    if event.startswith(blocked):
      raise PermissionError(f"{event} is not allowed in the sandbox")
    if event == "open":
      path, mode, flags = args
      writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
          isinstance(flags, int) and flags & _WRITE_FLAGS)
      if writes and not inside(path):
        raise PermissionError(f"writing {path!r} is not allowed in the sandbox")
    elif event in _PATH_EVENTS:
      if not all(inside(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))):
        raise PermissionError(f"{event} outside the sandbox temp dir is not allowed")

  sys.addaudithook(hook)


def _rss_bytes(pid: int) -> int:
  try:
    with open(f"/proc/{pid}/status", "rb") as f:
      for line in f:
        if line.startswith(b"VmRSS:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError):
    pass
  return 0


def _write_all(fd: int, data: bytes) -> None:
  view = memoryview(data)
  while view:
    n = os.write(fd, view)
    view = view[n:]


def format_exception(e: BaseException, limit_lines: int = 12) -> str:
  lines = traceback.format_exception(type(e), e, e.__traceback__)
  return "".join(lines[-limit_lines:])


def run_sandboxed(target: Callable[[Callable[[Any], None], str], None], timeout_s: float,
                  limits: Limits | None = None, tmp_root: str | None = None) -> ChildOutcome:
  """Runs `target(emit, tmpdir)` in a sandboxed child; `emit(msg)` sends one frame to the caller.

  The job dir is made under `tmp_root` (default: the system temp dir), which the sandbox uid must be
  able to enter.
  """
  limits = limits or Limits()
  tmpdir = tempfile.mkdtemp(prefix="job-", dir=tmp_root)
  if os.geteuid() == 0:
    os.chown(tmpdir, limits.uid, limits.gid)
  os.chmod(tmpdir, 0o700)
  r, w = os.pipe()
  start = time.monotonic()
  pid = os.fork()
  if pid == 0:
    code = 70
    try:
      os.close(r)
      _enter(limits, tmpdir, w)
      target(lambda msg: _write_all(w, wire.encode(msg)), tmpdir)
      code = 0
    except BaseException as e:  # noqa: BLE001  (report anything, then leave)
      try:
        _write_all(w, wire.encode({"kind": "crash", "error": format_exception(e)}))
      except BaseException:  # noqa: BLE001
        pass
    finally:
      os._exit(code)
  os.close(w)
  chunks, size, truncated, timed_out, memory_killed = [], 0, False, False, False
  deadline = start + timeout_s
  status = None
  try:
    while True:
      now = time.monotonic()
      if now >= deadline:
        timed_out = status is None
        break
      ready, _, _ = select.select([r], [], [], min(0.05, deadline - now))
      if ready:
        chunk = os.read(r, 1 << 20)
        if not chunk:
          break
        size += len(chunk)
        if size > MAX_CHILD_OUTPUT:
          truncated = True
          break
        chunks.append(chunk)
      if _rss_bytes(pid) > limits.memory_bytes:
        memory_killed = True
        break
      if status is None:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is not None:
          status = info
          deadline = min(deadline, time.monotonic() + 1.0)
  finally:
    try:
      os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
    _, wstatus = os.waitpid(pid, 0)
    os.close(r)
    shutil.rmtree(tmpdir, ignore_errors=True)
  exit_code = os.waitstatus_to_exitcode(wstatus)
  return ChildOutcome(data=b"".join(chunks), exit_code=exit_code if exit_code >= 0 else None,
                      signal=-exit_code if exit_code < 0 else None, timed_out=timed_out,
                      memory_killed=memory_killed, truncated=truncated, wall_s=time.monotonic() - start)
