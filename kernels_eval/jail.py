"""Kernel-level isolation of one job: Linux namespaces and an allowlisted, read-only view of the files.

`enter(spec)` is called by a freshly forked, single-threaded process C. C moves into new mount, PID,
network, IPC and UTS namespaces (and a user namespace when it is not root), forks J, the first process of
the new PID namespace, and never returns: it reports J's pid on `spec.pid_fd`, waits for J and exits as
J did. `enter` returns in J, which then sees:
  - a new root (a tmpfs, read-only once built) holding, at their own paths, read-only bind mounts of
    the system folders (`SYSTEM_PATHS`, a few /etc files) and of `spec.readable`, read-write bind mounts
    of `spec.writable`, a private size-capped tmpfs at /tmp (its cwd, HOME and TMPDIR), a minimal /dev
    (null, zero, full, random, urandom and `spec.devices`) and a /proc of the new PID namespace. Nothing
    else of the host exists: not the other jobs' folders, not the user's home, not root-only files;
  - no network interface but a loopback that is down; no host process to signal or trace;
  - an unprivileged identity: as root, `spec.uid`/`spec.gid` (one per worker slot, owning nothing); as a
    user, the user's own uid through a user namespace. No capabilities, no_new_privs, so nothing J runs
    can gain any; J is killed when C dies (and C when its parent dies), and every process of the
    namespace dies with J;
  - a seccomp filter (`seccomp_program`) that refuses kernel surfaces no job needs: new namespaces, the
    keyrings (shared by a uid's jobs), bpf, io_uring, userfaultfd, perf events, module and mount calls;
  - exactly `spec.env` as its environment, and no file descriptor but stdin/out/err and `spec.keep_fds`.
`run_command(argv, ...)` runs a program in a jail from any process, threads and all: it executes this file
as a launcher (`python -S jail.py SPEC`), which enters the jail and `execve`s the program.
`probe()` says whether this machine can set a jail up, and why not.

Linux only (x86-64 and arm64); needs root, or unprivileged user namespaces.
"""
from __future__ import annotations

import ctypes
import dataclasses
import errno
import json
import os
import platform
import signal
import subprocess
import sys
from typing import Mapping, Sequence

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
AT_RECURSIVE = 0x8000
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 22, 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
# Kernel surfaces a job never needs and attackers use (defence in depth: a seccomp filter answers EPERM).
# Per architecture: (audit arch, {syscall: number}, clone's number, clone3's number); the jail's own
# pivot_root and mount_setattr calls take their numbers from here too.
_DENIED = ("unshare", "setns", "add_key", "request_key", "keyctl", "bpf", "userfaultfd", "perf_event_open",
           "io_uring_setup", "io_uring_enter", "io_uring_register", "kexec_load", "kexec_file_load",
           "init_module", "finit_module", "delete_module", "mount", "umount2", "pivot_root", "swapon", "swapoff",
           "reboot", "open_by_handle_at", "acct", "syslog", "personality", "mount_setattr", "fsopen", "fsmount",
           "fspick", "move_mount", "open_tree")
SECCOMP = {
    "x86_64": (0xC000003E, dict(zip(_DENIED, (272, 308, 248, 249, 250, 321, 323, 298, 425, 426, 427, 246, 320, 175,
                                              313, 176, 165, 166, 155, 167, 168, 169, 304, 163, 103, 135, 442, 430,
                                              432, 433, 429, 428))), 56, 435),
    "aarch64": (0xC00000B7, dict(zip(_DENIED, (97, 268, 217, 218, 219, 280, 282, 241, 425, 426, 427, 104, 294, 105,
                                               273, 106, 40, 39, 41, 224, 225, 142, 265, 89, 116, 92, 442, 430, 432,
                                               433, 429, 428))), 220, 435),
}
NAMESPACE_FLAGS = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | 0x02000000
INSIDE_ID = 1000                      # the jail's uid/gid as seen inside a user namespace
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
                "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
                "/etc/nsswitch.conf", "/etc/passwd", "/etc/group", "/etc/localtime")
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus")
NEW_ROOT, OLD_ROOT = "/newroot", "/oldroot"
SETUP_FAILED, NO_NAMESPACES = 71, 72   # exit codes: J could not build the jail; C could not make namespaces


class IsolationUnavailable(RuntimeError):
  """This machine cannot set up the jail (no root and no user namespaces, a seccomp filter, ...)."""


@dataclasses.dataclass(frozen=True)
class Spec:
  """What one jail sees and is allowed.

  readable/writable: host paths bound read-only / read-write at the same path (missing ones skipped).
  devices: device nodes to bind (GPU). tmp_bytes/tmp_inodes: size of the private /tmp.
  uid/gid: the identity when the jail is set up by root (ignored otherwise).
  env: the whole environment inside. pid_fd: where C writes J's pid (-1: nowhere).
  keep_fds: descriptors J keeps open besides 0, 1 and 2 (a job's result pipe).
  """
  readable: tuple[str, ...] = ()
  writable: tuple[str, ...] = ()
  devices: tuple[str, ...] = ()
  tmp_bytes: int = 1 << 30
  tmp_inodes: int = 65536
  uid: int = 65534
  gid: int = 65534
  env: tuple[tuple[str, str], ...] = ()
  pid_fd: int = -1
  keep_fds: tuple[int, ...] = ()

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self))

  @classmethod
  def from_json(cls, text: str) -> "Spec":
    d = json.loads(text)
    return cls(**{k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
                  for k, v in d.items()})


_LIBC = None


def _libc():
  global _LIBC  # pylint: disable=global-statement
  if _LIBC is None:
    _LIBC = ctypes.CDLL(None, use_errno=True)
    _LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
  return _LIBC


def _check(result: int, what: str) -> None:
  if result != 0:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
  enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
  _check(_libc().mount(enc(src), enc(dst), enc(fstype), flags, enc(data)), f"mount {src} on {dst}")


def _syscall(name: str, *args) -> int:
  number = SECCOMP.get(platform.machine(), (0, {}))[1].get(name)
  if number is None:
    raise OSError(errno.ENOSYS, f"{name} on {platform.machine()}")
  return _libc().syscall(number, *args)


class _MountAttr(ctypes.Structure):
  _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
              ("userns_fd", ctypes.c_uint64)]


def _read_only(path: str) -> None:
  """Makes the mount at `path` and every mount below it read-only, nosuid and nodev."""
  attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0)
  if _syscall("mount_setattr", -100, os.fsencode(path), AT_RECURSIVE, ctypes.byref(attr),
              ctypes.sizeof(attr)) == 0:
    return
  if ctypes.get_errno() != errno.ENOSYS:
    _check(-1, f"mount_setattr {path}")
  for mount_point in _mounts_under(path):  # kernels before 5.12: one remount per mount
    _mount(None, mount_point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _mounts_under(path: str) -> list[str]:
  with open("/proc/self/mountinfo") as f:
    points = [line.split()[4].encode().decode("unicode_escape") for line in f]
  return [p for p in points if p == path or p.startswith(path.rstrip("/") + "/")]


def _make_parent(path: str) -> None:
  os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)


def _mirror(path: str, done: set[str]) -> str | None:
  """Recreates under NEW_ROOT the symlinks met on `path`; returns its real path, or None if missing."""
  parts = [p for p in path.split("/") if p]
  current = ""
  for i, part in enumerate(parts):
    current += "/" + part
    source = OLD_ROOT + current
    if os.path.islink(source):
      target = os.readlink(source)
      link = NEW_ROOT + current
      if current not in done:
        done.add(current)
        _make_parent(link)
        if not os.path.lexists(link):
          os.symlink(target, link)
      resolved = os.path.normpath(os.path.join(os.path.dirname(current), target))
      return _mirror("/".join([resolved] + parts[i + 1:]), done)
    if not os.path.exists(source):
      return None
  return current or "/"


def _bind_mount(source: str, target: str, flags: int = 0) -> None:
  """Binds `source` (a folder or a file) at `target`, making the mount point first."""
  _make_parent(target)
  if os.path.isdir(source):
    os.makedirs(target, mode=0o755, exist_ok=True)
  elif not os.path.exists(target):
    open(target, "wb").close()  # noqa: SIM115  (a mount point for a file)
  _mount(source, target, None, MS_BIND | MS_REC | flags)


def _bind(path: str, writable: bool, bound: list[str]) -> None:
  source, target = OLD_ROOT + path, NEW_ROOT + path
  _bind_mount(source, target)
  if writable:
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV)
  else:
    _read_only(target)
  bound.append(path)


def _bind_all(paths: Sequence[str], writable: bool, bound: list[str], links: set[str]) -> None:
  real = sorted({r for r in (_mirror(os.path.abspath(p), links) for p in paths) if r is not None})
  for path in real:
    if writable or not any(path == b or path.startswith(b.rstrip("/") + "/") for b in bound):
      _bind(path, writable, bound)


def _dev(devices: Sequence[str]) -> None:
  _mount("tmpfs", NEW_ROOT + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=1m")
  for node in DEVICES + tuple(devices):
    if os.path.exists(OLD_ROOT + node):
      _bind_mount(OLD_ROOT + node, NEW_ROOT + node, MS_NOSUID)
  os.makedirs(NEW_ROOT + "/dev/shm")
  _mount("tmpfs", NEW_ROOT + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777,size=64m")
  for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                       ("stderr", "/proc/self/fd/2")):
    os.symlink(target, f"{NEW_ROOT}/dev/{name}")


def _proc() -> None:
  """A /proc of the new PID namespace, with the kernel's tunables read-only."""
  os.makedirs(NEW_ROOT + "/proc")
  _mount("proc", NEW_ROOT + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
  for name in PROC_READ_ONLY:
    path = f"{NEW_ROOT}/proc/{name}"
    if os.path.exists(path):
      _mount(path, path, None, MS_BIND | MS_REC)
      _read_only(path)


def _build_root(spec: Spec, owner: tuple[int, int]) -> None:
  """Runs in J: builds the new root under a tmpfs and pivots into it."""
  _mount(None, "/", None, MS_REC | MS_PRIVATE)
  _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m")
  os.chdir("/tmp")
  os.mkdir("newroot")
  os.mkdir("oldroot")
  _check(_syscall("pivot_root", b"/tmp", b"oldroot"), "pivot_root")
  os.chdir("/")
  _mount(NEW_ROOT, NEW_ROOT, None, MS_BIND | MS_REC)
  tmp = NEW_ROOT + "/tmp"
  os.makedirs(tmp)
  _mount("tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV,
         f"mode=0700,uid={owner[0]},gid={owner[1]},size={spec.tmp_bytes},nr_inodes={spec.tmp_inodes}")
  bound: list[str] = []
  links: set[str] = set()
  _bind_all(SYSTEM_PATHS + spec.readable, False, bound, links)  # paths under /tmp land inside the private one
  _bind_all(spec.writable, True, bound, links)
  os.makedirs(NEW_ROOT + "/dev", exist_ok=True)
  _dev(spec.devices)
  _proc()
  _check(_libc().umount2(OLD_ROOT.encode(), MNT_DETACH), "umount old root")
  os.chdir(NEW_ROOT)
  _check(_syscall("pivot_root", b".", b"."), "pivot_root into the new root")
  _check(_libc().umount2(b".", MNT_DETACH), "umount the build root")
  os.chdir("/")
  _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


class _SockFilter(ctypes.Structure):
  _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
  _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program(machine: str) -> list[tuple[int, int, int, int]]:
  """The classic-BPF filter: another architecture's calls (i386, x32) kill the process; `_DENIED` calls,
  and `clone` with a namespace flag, fail with EPERM; `clone3` (whose flags BPF cannot read) with ENOSYS,
  which makes the C library fall back to `clone`; everything else is allowed."""
  ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
  allow, kill, eperm, enosys = 0x7FFF0000, 0x80000000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
  arch, denied, clone, clone3 = SECCOMP[machine]
  prog = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (ld, 0, 0, 0), (jge, 0, 1, 0x40000000),
          (ret, 0, 0, kill)]
  for number in sorted(set(denied.values())):
    prog += [(jeq, 0, 1, number), (ret, 0, 0, eperm)]
  prog += [(jeq, 0, 1, clone3), (ret, 0, 0, enosys), (jeq, 0, 3, clone), (ld, 0, 0, 16),
           (jset, 0, 1, NAMESPACE_FLAGS), (ret, 0, 0, eperm), (ret, 0, 0, allow)]
  return prog


def _install_seccomp() -> None:
  machine = platform.machine()
  if machine not in SECCOMP:
    return
  prog = seccomp_program(machine)
  filters = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
  fprog = _SockFprog(len(prog), filters)
  _check(_libc().prctl(PR_SET_SECCOMP, 2, ctypes.byref(fprog), 0, 0), "seccomp")


def _drop_privileges(spec: Spec, as_root: bool) -> None:
  """Leaves J with an unprivileged uid, no capabilities and no way to gain any."""
  libc = _libc()
  if as_root:
    os.setgroups([])
    os.setresgid(spec.gid, spec.gid, spec.gid)
    os.setresuid(spec.uid, spec.uid, spec.uid)  # from uid 0 to another: the kernel clears every capability
  else:
    for cap in range(64):
      libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(libc.capset(header, data), "capset")
  _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
  _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")  # after the uid change
  _install_seccomp()


def _write(path: str, text: str) -> None:
  with open(path, "w") as f:
    f.write(text)


def _wait_and_exit(pid: int) -> None:
  """C's whole life after the fork: wait for J, then end the way it ended."""
  _, status = os.waitpid(pid, 0)
  if os.WIFSIGNALED(status):
    sig = os.WTERMSIG(status)
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
      signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
  os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def close_fds_except(keep: Sequence[int]) -> None:
  """Closes every descriptor of this process but stdin, stdout, stderr and `keep`."""
  keep = sorted(set(keep) | {0, 1, 2})
  start = 0
  for fd in keep + [1 << 16]:
    if fd > start:
      os.closerange(start, fd)
    start = fd + 1


def enter(spec: Spec) -> None:
  """Moves this (freshly forked, single-threaded) process's future into a jail; returns inside it, in J.

  Raises OSError (in C, before anything ran) when a namespace cannot be made. Errors while J builds its
  root end J with exit code SETUP_FAILED and the message on stderr.
  """
  as_root = os.geteuid() == 0
  uid, gid = os.geteuid(), os.getegid()
  parent = os.getppid()
  _check(_libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")  # C dies with its parent
  if os.getppid() != parent:
    os._exit(1)
  flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
  _check(_libc().unshare(flags | (0 if as_root else CLONE_NEWUSER)), "unshare")
  if not as_root:
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{INSIDE_ID} {uid} 1\n")
    _write("/proc/self/gid_map", f"{INSIDE_ID} {gid} 1\n")
  pid = os.fork()
  if pid:
    close_fds_except([spec.pid_fd] if spec.pid_fd >= 0 else [])
    if spec.pid_fd >= 0:
      os.write(spec.pid_fd, pid.to_bytes(4, "big"))
      os.close(spec.pid_fd)
    _wait_and_exit(pid)
  try:
    if spec.pid_fd >= 0:
      os.close(spec.pid_fd)
    owner = (spec.uid, spec.gid) if as_root else (INSIDE_ID, INSIDE_ID)
    _build_root(spec, owner)
    os.chdir("/tmp")
    _drop_privileges(spec, as_root)
    os.environ.clear()
    os.environ.update(dict(spec.env))
    close_fds_except(spec.keep_fds)
  except BaseException as e:  # noqa: BLE001  (nothing of the job ran yet: report and leave)
    os.write(2, f"jail: {e!r}\n".encode())
    os._exit(SETUP_FAILED)


def run_command(argv: Sequence[str], *, cwd: str, env: Mapping[str, str], readable: Sequence[str] = (),
                writable: Sequence[str] = (), timeout_s: float, uid: int = 65534,
                gid: int = 65534) -> subprocess.CompletedProcess:
  """Runs `argv` in a fresh jail (see the module docstring) and returns its output as text.

  `cwd` must be inside a `writable` path or /tmp. Raises subprocess.TimeoutExpired at `timeout_s`
  (the jail and everything in it is killed) and IsolationUnavailable when the jail cannot be set up.
  """
  spec = Spec(readable=tuple(readable), writable=tuple(writable), env=tuple(sorted(env.items())), uid=uid, gid=gid)
  launcher = [sys.executable, "-S", "-E", os.path.abspath(__file__), spec.to_json(), cwd, *argv]
  done = run_group(launcher, timeout_s=timeout_s)
  if done.returncode in (SETUP_FAILED, NO_NAMESPACES) and done.stderr.startswith("jail:"):
    raise IsolationUnavailable(done.stderr.strip())
  return subprocess.CompletedProcess(list(argv), done.returncode, done.stdout, done.stderr)


def run_group(argv: Sequence[str], *, timeout_s: float, cwd: str | None = None,
              env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
  """Runs argv in a process group of its own, output as text; at the timeout the whole group is killed
  and subprocess.TimeoutExpired raised."""
  with subprocess.Popen(list(argv), cwd=cwd, env=None if env is None else dict(env), stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                        start_new_session=True, close_fds=True) as proc:
    try:
      out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.communicate()
      raise
  return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def _launch(spec_json: str, cwd: str, argv: list[str]) -> None:
  """The launcher's main: enter a jail, then become `argv` there."""
  spec = Spec.from_json(spec_json)
  try:
    enter(spec)
  except OSError as e:
    os.write(2, f"jail: cannot create namespaces ({e})\n".encode())
    os._exit(NO_NAMESPACES)
  try:
    os.chdir(cwd)
    os.execvpe(argv[0], argv, os.environ)
  except OSError as e:
    os.write(2, f"{argv[0]}: {e.strerror}\n".encode())
    os._exit(127)


def probe() -> str | None:
  """None when a jail can be set up here, else why not (with what to do about it)."""
  if sys.platform != "linux" or platform.machine() not in SECCOMP:
    return f"kernel-level isolation needs Linux on x86-64 or arm64 (this is {sys.platform}/{platform.machine()})"
  try:
    done = run_command(["/bin/sh", "-c", "test ! -e /oldroot && test \"$(cat /proc/1/comm)\" != systemd"],
                       cwd="/tmp", env={"PATH": "/usr/bin:/bin"}, timeout_s=30)
  except (IsolationUnavailable, OSError, subprocess.TimeoutExpired) as e:
    hint = ("" if os.geteuid() == 0 else " As a user, unprivileged user namespaces must be enabled "
            "(sysctl kernel.unprivileged_userns_clone=1, or kernel.apparmor_restrict_unprivileged_userns=0).")
    return f"could not set up the job jail: {e}.{hint}"
  if done.returncode != 0:
    return f"the job jail did not isolate as expected (exit {done.returncode}: {done.stderr.strip()[-300:]})"
  return None


if __name__ == "__main__":
  _launch(sys.argv[1], sys.argv[2], sys.argv[3:])
