"""The sandbox every piece of untrusted code runs in: one forked child per job step.

`run_sandboxed(target, timeout_s, limits, view)` forks a child C that isolates itself, then runs
`target(emit, tmpdir)`, where `emit(msg)` writes one frame to the caller. Isolation, by `limits.isolation`:

  "namespaces" (the default): `kernels_eval.jail` — new mount, PID, network, IPC and UTS namespaces, an
      allowlisted read-only view of the files (`view`), a private size-capped /tmp, an unprivileged uid
      without capabilities, exactly `view.env` as environment. Nothing the job starts outlives it: the
      job is PID 1 of its namespace, and the parent kills it by pid.
  "process" (an explicit opt-out for machines without namespaces): the child calls setsid, leaves the
      network namespace when root, drops to `limits.uid` when root and works in a private host temp dir.
      Files, other jobs and the parent's environment are then only guarded by uid and the audit hook.

In both, before any job code: rlimits (address space on CPU, CPU seconds, file size, no core dumps, open
files, processes), stdin/stdout/stderr on /dev/null and every other descriptor closed but the result pipe.
The parent reads the child's frames (at most `max_output` bytes), kills the job at the wall deadline
or when the resident memory of its process tree passes the cap, and cleans up whatever is left.

`lock_down(tmpdir)` is called by a runner right before it loads untrusted code: an audit hook that refuses
sockets, subprocesses, exec, fork, signals, ctypes and file writes outside `tmpdir` — defence in depth
behind the kernel's isolation, never the only wall.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import resource
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable

from kernels_eval import jail
from kernels_eval import wire

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
MAX_CHILD_OUTPUT = 128 << 20
ISOLATIONS = ("namespaces", "process")
PID_REPORT_TIMEOUT_S = 10.0


@dataclasses.dataclass
class Limits:
  """Per-job limits. `uid`/`gid`: the identity of jobs set up by root (a pool gives each worker slot a uid
  of its own above `uid`). `tmp_bytes`: size of a job's private /tmp ("namespaces"). `gpu_memory_bytes`:
  the most device memory a job's JAX may take (its allocator's cap, set by the pool)."""
  memory_bytes: int = 4 << 30
  nproc: int = 512
  cpu_seconds: int = 600
  file_bytes: int = 1 << 30
  open_files: int = 512
  uid: int = 1 << 30
  gid: int = 1 << 30
  address_space_limit: bool = True
  tmp_bytes: int = 2 << 30
  isolation: str = "namespaces"
  gpu_memory_bytes: int = 8 << 30

  def __post_init__(self):
    if self.isolation not in ISOLATIONS:
      raise ValueError(f"Limits.isolation={self.isolation!r} is not one of {ISOLATIONS}")
    if self.uid <= 0 or self.gid <= 0:
      raise ValueError("Limits.uid and Limits.gid must be unprivileged (> 0)")


@dataclasses.dataclass(frozen=True)
class View:
  """What a namespaced job sees besides the system folders: see `jail.Spec`."""
  readable: tuple[str, ...] = ()
  writable: tuple[str, ...] = ()
  devices: tuple[str, ...] = ()
  env: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass
class ChildOutcome:
  """What came back from one sandboxed child. `data` holds its raw frames."""
  data: bytearray
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


def _set_rlimits(limits: Limits) -> None:
  if limits.address_space_limit:
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
  resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds))
  resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
  resource.setrlimit(resource.RLIMIT_NPROC, (limits.nproc, limits.nproc))


def _enter_process_mode(limits: Limits, tmpdir: str, keep_fds: tuple[int, ...]) -> None:
  """The opt-out isolation ("process"): runs in the child, as the forking user, before any job code."""
  libc = ctypes.CDLL(None, use_errno=True)
  is_root = os.geteuid() == 0
  if is_root and libc.unshare(CLONE_NEWNET) != 0:
    raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")
  jail.close_fds_except(keep_fds)
  os.chdir(tmpdir)
  if is_root:
    os.setgroups([])
    os.setgid(limits.gid)
    os.setuid(limits.uid)
  libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def _job_env(view: View, tmpdir: str) -> dict[str, str]:
  return {**dict(view.env), "TMPDIR": tmpdir, "HOME": tmpdir, "TMP": tmpdir, "TEMP": tmpdir}


def _child(target, limits: Limits, view: View, tmpdir: str, w: int, pid_w: int, keep_fds: tuple[int, ...]) -> None:
  """Runs in the forked child; never returns."""
  code = 70
  try:
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
      os.dup2(devnull, fd)
    if limits.isolation == "namespaces":
      jail.enter(jail.Spec(readable=view.readable, writable=view.writable, devices=view.devices,
                           tmp_bytes=limits.tmp_bytes, uid=limits.uid, gid=limits.gid,
                           env=tuple(_job_env(view, tmpdir).items()), pid_fd=pid_w, keep_fds=(w, *keep_fds)))
      null = os.open(os.devnull, os.O_RDWR)
      os.dup2(null, 2)
      os.close(null)
    else:
      os.dup2(devnull, 2)
      os.close(pid_w)
      _enter_process_mode(limits, tmpdir, (w, *keep_fds))
      os.environ.clear()
      os.environ.update(_job_env(view, tmpdir))
    tempfile.tempdir = tmpdir
    _set_rlimits(limits)
    target(lambda msg: _write_all(w, wire.encode(msg)), tmpdir)
    code = 0
  except BaseException as e:  # noqa: BLE001  (report anything, then leave)
    try:
      _write_all(w, wire.encode({"kind": "crash", "error": format_exception(e)}))
    except BaseException:  # noqa: BLE001
      pass
  finally:
    os._exit(code)


# One fork at a time per process: on Python >= 3.12 filelock's audit hook refuses an `os.fork` made while another
# thread's fork is between its at-fork hooks ("os.fork is unsafe while filelock is changing descriptor ownership").
_FORK_LOCK = threading.Lock()
_BLOCKED_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                   "os.forkpty", "os.kill", "os.killpg", "pty.spawn", "os.startfile", "sys.addaudithook",
                   "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata")
_PATH_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.truncate",
                "os.chown", "os.chmod", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def lock_down(tmpdir: str, *, allow_dlopen: bool = False) -> None:
  """Installs the audit hook (irreversible). `allow_dlopen` lets a runner load a compiled library.

  Writes are allowed under `tmpdir` and, when the worker was given one, JAX's compilation cache dir.
  Some calls raise no audit event (`os.mkfifo`, writes relative to a `dir_fd`, `_posixsubprocess`): the
  hook is not a sandbox, the kernel's isolation is.
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


def _tree(pid: int) -> list[int]:
  """`pid` and all its descendants (from /proc)."""
  out, stack = [], [pid]
  while stack:
    p = stack.pop()
    if p in out:
      continue
    out.append(p)
    try:
      for tid in os.listdir(f"/proc/{p}/task"):
        with open(f"/proc/{p}/task/{tid}/children", "rb") as f:
          stack.extend(int(c) for c in f.read().split())
    except (OSError, ValueError):
      continue
  return out


def _memory(pid: int, field: bytes, path: str) -> int:
  try:
    with open(f"/proc/{pid}/{path}", "rb") as f:
      for line in f:
        if line.startswith(field):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError):
    pass
  return 0


def tree_memory_bytes(pid: int, limit: int) -> int:
  """Memory of `pid` and its descendants: the sum of resident sizes, or, when that passes `limit` (forked
  children share their parent's pages), of proportional sizes, which count a shared page once."""
  tree = _tree(pid)
  rss = sum(_memory(p, b"VmRSS:", "status") for p in tree)
  if rss <= limit or len(tree) == 1:
    return rss
  return sum(_memory(p, b"Pss:", "smaps_rollup") for p in tree)


def _write_all(fd: int, data: bytes) -> None:
  view = memoryview(data)
  while view:
    n = os.write(fd, view)
    view = view[n:]


def format_exception(e: BaseException, limit_lines: int = 12) -> str:
  lines = traceback.format_exception(type(e), e, e.__traceback__)
  return "".join(lines[-limit_lines:])


def remove_tree(path: str) -> None:
  """Removes a folder however deep or odd its content; never raises. GNU `rm -rf` walks any depth with a
  bounded number of descriptors and skips what it cannot remove (a recursive Python walk does neither)."""
  try:
    subprocess.run(["rm", "-rf", "--", path], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=300, check=False)
  except (OSError, subprocess.SubprocessError):
    pass


def _read_pid(fd: int) -> int | None:
  """J's pid as reported by C (namespaces), or None when C never reported one."""
  ready, _, _ = select.select([fd], [], [], PID_REPORT_TIMEOUT_S)
  data = os.read(fd, 4) if ready else b""
  os.close(fd)
  return int.from_bytes(data, "big") if len(data) == 4 else None


def _kill(pid: int | None, pgid: int) -> None:
  for kill, target in ((os.kill, pid), (os.killpg, pgid)):
    if target:
      try:
        kill(target, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass


def run_sandboxed(target: Callable[[Callable[[Any], None], str], None], timeout_s: float,
                  limits: Limits | None = None, view: View | None = None,
                  tmp_root: str | None = None, keep_fds: tuple[int, ...] = (),
                  max_output: int = MAX_CHILD_OUTPUT) -> ChildOutcome:
  """Runs `target(emit, tmpdir)` in a sandboxed child; `emit(msg)` sends one frame to the caller.

  `view`: what a namespaced job may read and write, and its environment. `tmp_root`: where the
  "process" isolation makes the job's temp dir (the sandbox uid must be able to enter it). `keep_fds`:
  descriptors the child keeps (the GPU lock's). `max_output`: the cap on the frames read back (bytes).
  """
  limits, view = limits or Limits(), view or View()
  namespaced = limits.isolation == "namespaces"
  tmpdir = "/tmp" if namespaced else tempfile.mkdtemp(prefix="job-", dir=tmp_root)
  if not namespaced:
    if os.geteuid() == 0:
      os.chown(tmpdir, limits.uid, limits.gid)
    os.chmod(tmpdir, 0o700)
  r, w = os.pipe()
  pid_r, pid_w = os.pipe()
  start = time.monotonic()
  with _FORK_LOCK:
    pid = os.fork()
  if pid == 0:
    os.close(r)
    os.close(pid_r)
    _child(target, limits, view, tmpdir, w, pid_w, keep_fds)
  os.close(w)
  os.close(pid_w)
  job_pid = _read_pid(pid_r) if namespaced else pid
  try:
    data, timed_out, memory_killed, truncated = _collect(r, pid, job_pid or pid, start + timeout_s, limits,
                                                         max_output)
  finally:
    _kill(job_pid, pid)
    _, wstatus = os.waitpid(pid, 0)
    os.close(r)
    if not namespaced:
      remove_tree(tmpdir)
  exit_code = os.waitstatus_to_exitcode(wstatus)
  return ChildOutcome(data=data, exit_code=exit_code if exit_code >= 0 else None,
                      signal=-exit_code if exit_code < 0 else None, timed_out=timed_out,
                      memory_killed=memory_killed, truncated=truncated, wall_s=time.monotonic() - start)


def _wait_exit(pid: int, until: float) -> None:
  """Gives a child that closed its pipe until `until` to exit on its own (its status is then its own)."""
  while time.monotonic() < until:
    if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
      return
    time.sleep(0.005)


def wipe(buffer: bytearray) -> None:
  """Zeroes a buffer in place (a job's frames must not linger in the memory the next child inherits)."""
  if buffer:
    ctypes.memset((ctypes.c_char * len(buffer)).from_buffer(buffer), 0, len(buffer))


def _collect(r: int, pid: int, job_pid: int, deadline: float, limits: Limits,
             max_output: int) -> tuple[bytearray, bool, bool, bool]:
  """Reads the child's frames until it exits (or the deadline, the memory cap or the output cap), into one
  buffer that the caller can `wipe` (never into short-lived copies)."""
  buffer, size, truncated, timed_out, memory_killed = bytearray(1 << 16), 0, False, False, False
  exited = False
  while True:
    now = time.monotonic()
    if now >= deadline:
      timed_out = not exited
      break
    ready, _, _ = select.select([r], [], [], min(0.05, deadline - now))
    if ready:
      if size == len(buffer):
        buffer.extend(bytes(len(buffer)))
      n = os.readv(r, [memoryview(buffer)[size:]])
      if not n:
        _wait_exit(pid, min(deadline, time.monotonic() + 1.0))
        break
      size += n
      if size > max_output:
        truncated = True
        break
    if tree_memory_bytes(job_pid, limits.memory_bytes) > limits.memory_bytes:
      memory_killed = True
      break
    if not exited and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
      exited = True
      deadline = min(deadline, time.monotonic() + 1.0)
  del buffer[size:]
  return buffer, timed_out, memory_killed, truncated
