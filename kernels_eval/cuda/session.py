"""Driving the harness host program (`runner.cu`) for one candidate library, in its own process.

The parent writes the trial inputs as raw files, starts `runner <lib.so> <job_dir> <reply_fd>` in a new
process group (optionally under compute-sanitizer), sends commands on stdin and reads one reply line
per command from a dedicated pipe, with a deadline per command. The candidate runs only in that child:
a CUDA error, crash or hang ends the child (the process group is killed on a deadline), never the
parent, and the next candidate gets a fresh child.

The child dies with the process that started it, even when that one is killed (a job's timeout under the
"process" isolation, which has no PID namespace to take the child along): it starts under `setpriv
--pdeathsig KILL` where util-linux provides it, and the harness itself sets the same parent-death signal
(`PARENT_ENV`, not under compute-sanitizer, whose child it then is). The parent-death signal follows the
thread that started the child: drive a session from a thread that outlives it.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import resource
import select
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Sequence

import numpy as np

MAX_OUTPUT_FILE_BYTES = 1 << 31
PARENT_ENV = "KERNELS_EVAL_HARNESS_PARENT"  # pid the harness must die with (runner.cu)


class RunnerFailure(RuntimeError):
  """The candidate's process failed. kind: cuda_error | crash | timeout | no_device | harness_error |
  sanitizer."""

  def __init__(self, kind: str, message: str):
    super().__init__(f"{kind}: {message}")
    self.kind, self.message = kind, message


@dataclasses.dataclass
class CheckReply:
  """outputs[t]: output of trial t; determinism: trial 0 run again; mutated: (trial, input) pairs."""
  outputs: list[np.ndarray]
  determinism: np.ndarray
  mutated: list[tuple[int, int]]
  launches: int
  foreign_streams: int


@dataclasses.dataclass
class TimeReply:
  """ms: the per-call device time of each round (method in `runner.cu`); timed_output: the output of the last
  timed call, which ran on set timed_set."""
  ms: list[float]
  timed_set: int
  timed_output: np.ndarray


@functools.lru_cache(maxsize=1)
def _setpriv() -> str | None:
  """util-linux's setpriv, when it exists and knows --pdeathsig (2.33 and later)."""
  path = shutil.which("setpriv", path="/usr/bin:/bin")
  if path is None:
    return None
  try:
    usage = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=10, check=False).stdout
  except (OSError, subprocess.TimeoutExpired):
    return None
  return path if "--pdeathsig" in usage else None


def _launcher(cmd: list[str]) -> list[str]:
  """Prefixes `cmd` with a shell that lowers the core and file-size limits, then execs it; and that with
  `setpriv --pdeathsig KILL` where available, the shell first checking that its parent is still this process
  (one that died before setpriv set the signal would never send it). No Python runs between fork and
  exec, so this is safe from a process with JAX's threads."""
  _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  cap = MAX_OUTPUT_FILE_BYTES if hard == resource.RLIM_INFINITY else min(hard, MAX_OUTPUT_FILE_BYTES)
  # `ulimit -f` counts 512-byte blocks in dash and 1 KiB blocks in bash: cap // 1024 stays under `cap`.
  script = f'ulimit -c 0 && ulimit -f {cap // 1024} && exec "$@"'
  setpriv = _setpriv()
  if setpriv is None:
    return ["/bin/sh", "-c", script, "runner", *cmd]
  return [setpriv, "--pdeathsig", "KILL", "/bin/sh", "-c", f'[ "$PPID" = {os.getpid()} ] && {script}', "runner",
          *cmd]


def sanitizer_path(toolkit_root: str) -> str | None:
  found = pathlib.Path(toolkit_root) / "bin" / "compute-sanitizer"
  return str(found) if found.exists() else shutil.which("compute-sanitizer")


class RunnerSession:
  """One child process running one candidate library on the trial inputs.

  Args:
    runner: path of the compiled harness program.
    library: the candidate's audited shared library.
    trials: inputs per trial, in argument order (same shapes across trials: timing rotates over them).
    out_shape, out_dtype: the reference output's shape and numpy dtype.
    dims: integer size arguments in DIMS order.
    sanitizer: compute-sanitizer executable to run the child under (memcheck), or None.
  """

  def __init__(self, runner: str, library: str, trials: Sequence[Sequence[np.ndarray]],
               out_shape: tuple[int, ...], out_dtype: np.dtype, dims: Sequence[int],
               sanitizer: str | None = None):
    self.out_shape, self.out_dtype = tuple(out_shape), np.dtype(out_dtype)
    self.dir = pathlib.Path(tempfile.mkdtemp(prefix="cuda_job_"))
    shapes = {tuple(x.shape for x in trial) for trial in trials}
    if len(shapes) != 1:
      raise ValueError("RunnerSession: every trial must have the same input shapes")
    out_bytes = int(np.prod(self.out_shape, dtype=np.int64)) * self.out_dtype.itemsize
    in_bytes = [x.nbytes for x in trials[0]]
    (self.dir / "job.txt").write_text(
        f"inputs {len(in_bytes)}\nbytes {' '.join(map(str, in_bytes))} {out_bytes}\n"
        f"dims {len(dims)} {' '.join(str(int(d)) for d in dims)}\ntrials {len(trials)}\n")
    for t, trial in enumerate(trials):
      for k, x in enumerate(trial):
        np.ascontiguousarray(x).tofile(self.dir / f"in_{t}_{k}.bin")
    self.n_trials = len(trials)
    self.sanitized = bool(sanitizer)
    read_fd, write_fd = os.pipe()
    cmd = [runner, library, str(self.dir), str(write_fd)]
    if sanitizer:
      cmd = [sanitizer, "--tool", "memcheck", "--error-exitcode", "86", "--print-limit", "4", *cmd]
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
                                                         "HOME", "LANG", "NVIDIA_VISIBLE_DEVICES")}
    env["TMPDIR"] = str(self.dir)
    if not sanitizer:
      env[PARENT_ENV] = str(os.getpid())
    self.log_path = self.dir / "log.txt"
    with open(self.log_path, "w") as log:
      self.proc = subprocess.Popen(_launcher(cmd), stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                   cwd=self.dir, env=env, pass_fds=(write_fd,), start_new_session=True, text=True)
    os.close(write_fd)
    self._replies = os.fdopen(read_fd, "r")
    self._buffer = ""

  def _command(self, line: str, timeout_s: float) -> str:
    try:
      self.proc.stdin.write(line + "\n")
      self.proc.stdin.flush()
    except BrokenPipeError:
      pass
    deadline = time.monotonic() + timeout_s
    fd = self._replies.fileno()
    while "\n" not in self._buffer:
      left = deadline - time.monotonic()
      if left <= 0:
        self.kill()
        raise RunnerFailure("timeout", f"`{line.split()[0]}` did not finish within {timeout_s:.0f} s")
      ready, _, _ = select.select([fd], [], [], left)
      if not ready:
        continue
      chunk = os.read(fd, 65536).decode(errors="replace")
      if not chunk:
        raise self._died(line)
      self._buffer += chunk
    reply, self._buffer = self._buffer.split("\n", 1)
    if reply.startswith("ok "):
      return reply
    self.proc.wait(timeout=30)
    kind = reply.split(" ", 1)[0]
    message = reply.split(" ", 1)[1] if " " in reply else reply
    if self.proc.returncode == 86 or "========= " in self._log():
      raise RunnerFailure("sanitizer", self._sanitizer_report() or message)
    raise RunnerFailure(kind if kind in ("cuda_error", "no_device", "harness_error") else "harness_error",
                        message)

  def _log(self) -> str:
    try:
      return self.log_path.read_text(errors="replace")[-20000:]
    except OSError:
      return ""

  def _sanitizer_report(self, log: str | None = None) -> str:
    log = self._log() if log is None else log
    lines = [ln.replace("========= ", "") for ln in log.splitlines() if ln.startswith("=========")]
    return "\n".join(ln for ln in lines if ln.strip())[:1200]

  def _died(self, line: str) -> RunnerFailure:
    try:
      code = self.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
      self.kill()
      return RunnerFailure("timeout", "the candidate process stopped answering")
    log = self._log()
    if code == 86 or "=========" in log:
      return RunnerFailure("sanitizer", self._sanitizer_report(log))
    if code < 0:
      return RunnerFailure("crash", f"the candidate process was killed by {signal.Signals(-code).name} "
                           f"during `{line.split()[0]}`")
    return RunnerFailure("crash", f"the candidate process exited with status {code} during `{line.split()[0]}`"
                         + (f": {log.strip()[-400:]}" if log.strip() else ""))

  def _finish_sanitized(self) -> None:
    """compute-sanitizer reports at exit: end the process and turn any report into a failure."""
    try:
      self.proc.stdin.write("quit\n")
      self.proc.stdin.flush()
      code = self.proc.wait(timeout=60)
    except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
      self.kill()
      code = self.proc.returncode
    report = self._sanitizer_report()
    if code == 86 or "ERROR SUMMARY: 0 errors" not in report and "Invalid" in report:
      raise RunnerFailure("sanitizer", report or f"compute-sanitizer exited with status {code}")

  def _read_out(self, name: str) -> np.ndarray:
    return np.fromfile(self.dir / name, dtype=self.out_dtype).reshape(self.out_shape)

  def check(self, timeout_s: float = 60.0) -> CheckReply:
    """All trials and the determinism rerun; `timeout_s` includes starting the process and CUDA."""
    reply = self._command("check", timeout_s)
    if self.sanitized:
      self._finish_sanitized()
    fields = dict(kv.split("=", 1) for kv in reply.split()[2:])
    mutated = [] if fields["mutated"] == "-" else [
        tuple(int(x) for x in pair.split(":")) for pair in fields["mutated"].split(",")]
    return CheckReply([self._read_out(f"out_{t}.bin") for t in range(self.n_trials)],
                      self._read_out("det.bin"), mutated, int(fields["launches"]),
                      int(fields["foreign_streams"]))

  def time(self, calls: int, warmup: int, rounds: int, timeout_s: float = 60.0) -> TimeReply:
    """`rounds` per-call device times, each from loops of `calls` iterations, after `warmup` calls."""
    reply = self._command(f"time {int(calls)} {int(warmup)} {int(rounds)}", timeout_s)
    fields = dict(kv.split("=", 1) for kv in reply.split()[2:])
    return TimeReply([float(x) for x in fields["ms"].split(",")], int(fields["set"]), self._read_out("timed.bin"))

  def kill(self):
    """Kills the child's whole process group (anything it may have spawned included)."""
    try:
      os.killpg(self.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
    self.proc.wait()

  def close(self):
    if self.proc.poll() is None:
      try:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=5)
      except (BrokenPipeError, OSError, subprocess.TimeoutExpired, ValueError):
        pass
    self.kill()
    for stream in (self.proc.stdin, self._replies):
      try:
        stream.close()
      except (BrokenPipeError, OSError):
        pass
    shutil.rmtree(self.dir, ignore_errors=True)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
