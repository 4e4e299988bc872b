"""Compiling candidate CUDA source into a shared library, with a cross-process compile cache; and
preprocessing it for the static checks.

Every candidate is built with the same fixed flags (`nvcc_flags`): `-O3 -std=c++17 -lineinfo`, one
architecture, position-independent code, and the CUDA runtime linked dynamically (`-cudart none
-l:libcudart.so.13`, the toolkit's soname) so the symbol audit sees every runtime call.

How nvcc runs (`run_nvcc`, the only place that starts it): in a fresh job folder, on `solution.cu`,
with the toolchain's scrubbed environment (`Toolchain.env`: nothing inherited), under `prlimit` caps on
address space and file size, its whole process group killed at the timeout. In the parent it runs
through `kernels_eval.jail.run_command` (new namespaces, no network, a read-only view of the system folders
and the toolkit, only the job folder writable; files outside that view do not exist for nvcc). Inside a worker,
which is jailed already, it runs directly (`jailed=False`).

Preprocessing (`preprocess`) runs nvcc -E twice with the compile flags. nvcc -E alone gives the
*device* pass only (gcc -E with -D__CUDA_ARCH__=<arch>0 and -DCUDA_DOUBLE_MATH_FUNCTIONS: cicc's
input); the host pass (the input of cudafe++ and the host compiler) is the same command plus
`-Xcompiler -U__CUDA_ARCH__,-UCUDA_DOUBLE_MATH_FUNCTIONS`, which gives nvcc's own host-pass text byte
for byte (`-keep`'s `.cpp4.ii`; the device pass equals `.cpp1.ii`). The static checks read both, so
code that only one side compiles (`#ifdef __CUDA_ARCH__`) is seen. `-Wpedantic` makes GCC report GNU
line markers written in the source; it changes nothing in the output.

Cache: key = sha256(source, flags, toolchain fingerprint). The library and a JSON record (success,
log) live under `<cache_dir>/<key[:2]>/`. A per-key `flock` makes concurrent processes compile a key
once; results are copied to a temporary name and `os.replace`d into place, so readers never see a
partial file and every cached file belongs to the parent. A failed compile is cached as well (its log
is the feedback).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import pathlib
import re
import resource
import shutil
import subprocess
import tempfile
import time
from typing import Iterator, Sequence

from kernels_eval import jail
from kernels_eval.cuda import toolchain as toolchain_lib
from kernels_eval.cuda.prototype import SHIM_FILENAME
from kernels_eval.cuda.static_check import SOURCE_NAME

CACHE_ENV = "KERNELS_EVAL_CACHE_DIR"
COMPILE_TIMEOUT_S = 180.0
PREPROCESS_TIMEOUT_S = 30.0
FEEDBACK_LINES = 24
CONTEXT_LINES = 3  # kept after an error in solution.cu: the quoted line, the caret, one more
PRLIMIT = "/usr/bin/prlimit"
PREPROCESS_LIMITS = (512 << 20, 32 << 20)  # (address space, largest file written) of one nvcc run
COMPILE_LIMITS = (8 << 30, 1 << 30)
JAIL_UID = 65534  # the identity `jail.run_command` gives the job when root starts it
HOST_PASS = ("-Xcompiler", "-U__CUDA_ARCH__,-UCUDA_DOUBLE_MATH_FUNCTIONS")
_OUT_OF_MEMORY = re.compile(r"out of memory|memory exhausted|Cannot allocate memory")


def default_cache_dir() -> pathlib.Path:
  """KERNELS_EVAL_CACHE_DIR/cuda, else <system temp dir>/kernels_eval-<uid>/cuda. Sandboxed children
  only read it, so it must be world-readable (folders 0755, files 0644) and writable by the parent."""
  root = os.environ.get(CACHE_ENV) or os.path.join(tempfile.gettempdir(), f"kernels_eval-{os.getuid()}")
  return pathlib.Path(root) / "cuda"


def nvcc_flags(tc: toolchain_lib.Toolchain, arch: str) -> list[str]:
  return ["-O3", "-std=c++17", "-lineinfo", f"-arch={arch}", "-shared", "-Xcompiler", "-fPIC",
          "-cudart", "none", f"-L{tc.cudart_dir}", f"-l:{tc.cudart_soname}",
          "-Xlinker", f"-rpath={tc.cudart_dir}"]


@dataclasses.dataclass
class CompileResult:
  """ok: nvcc succeeded; library: path of the .so (None on failure); log: nvcc's raw output;
  feedback: the useful lines of the log for the policy; seconds: nvcc wall time (0 on a hit)."""
  ok: bool
  library: str | None
  log: str
  feedback: str
  key: str
  cache_hit: bool
  seconds: float


def _capped(kind: int, value: int) -> int:
  """`value`, lowered to this process's hard limit of `kind` (nvcc inherits it and may only lower it)."""
  hard = resource.getrlimit(kind)[1]
  return value if hard == resource.RLIM_INFINITY else min(value, hard)


def run_nvcc(tc: toolchain_lib.Toolchain, args: Sequence[str], job_dir: str, *, timeout_s: float,
             limits: tuple[int, int], jailed: bool) -> subprocess.CompletedProcess:
  """Runs `nvcc args` in `job_dir` (see the module docstring). Raises subprocess.TimeoutExpired."""
  memory, file_size = _capped(resource.RLIMIT_AS, limits[0]), _capped(resource.RLIMIT_FSIZE, limits[1])
  argv = [PRLIMIT, f"--as={memory}", f"--fsize={file_size}", "--", tc.nvcc, *args]
  env = tc.env(job_dir)
  if not jailed:
    return jail.run_group(argv, cwd=job_dir, env=env, timeout_s=timeout_s)
  readable = sorted({tc.root, tc.cudart_dir, os.path.dirname(tc.nvcc)})
  return jail.run_command(argv, cwd=job_dir, env=env, readable=readable, writable=[job_dir], timeout_s=timeout_s,
                          uid=JAIL_UID, gid=JAIL_UID)


@contextlib.contextmanager
def _job_dir(parent: str | None, jailed: bool) -> Iterator[str]:
  """A fresh folder for one nvcc run, owned by the jail's identity when a jail started by root runs it."""
  with tempfile.TemporaryDirectory(prefix="nvcc_", dir=parent) as job:
    if jailed and os.geteuid() == 0:
      os.chown(job, JAIL_UID, JAIL_UID)
    yield job


@dataclasses.dataclass
class Preprocessed:
  """nvcc -E of one source. host/device: the two passes' text (see the module docstring); log: their
  messages; reason: None, or why it could not be preprocessed (`preprocess_timeout`,
  `preprocess_too_large`, `preprocess_error`), explained in `feedback`."""
  host: str = ""
  device: str = ""
  log: str = ""
  reason: str | None = None
  feedback: str = ""


def _preprocess_pass(tc: toolchain_lib.Toolchain, arch: str, job: str, extra: Sequence[str],
                     timeout_s: float) -> Preprocessed:
  """One pass; its text is returned in `host` (the caller files it)."""
  out = pathlib.Path(job) / "out.ii"
  args = [*nvcc_flags(tc, arch), "-E", *extra, "-Xcompiler", "-Wpedantic", SOURCE_NAME, "-o", out.name]
  try:
    proc = run_nvcc(tc, args, job, timeout_s=timeout_s, limits=PREPROCESS_LIMITS, jailed=True)
  except subprocess.TimeoutExpired:
    return Preprocessed(reason="preprocess_timeout",
                        feedback=f"the preprocessor did not finish within {timeout_s:.0f} s")
  log = (proc.stdout + proc.stderr).replace(job + "/", "")
  size = out.stat().st_size if out.exists() else 0
  if size >= _capped(resource.RLIMIT_FSIZE, PREPROCESS_LIMITS[1]) or _OUT_OF_MEMORY.search(log):
    return Preprocessed(log=log, reason="preprocess_too_large", feedback="the preprocessed source exceeds "
                        f"{PREPROCESS_LIMITS[1] >> 20} MiB or the preprocessor's {PREPROCESS_LIMITS[0] >> 20} MiB")
  if proc.returncode != 0:
    return Preprocessed(log=log, reason="preprocess_error", feedback=trim_log(log) or "nvcc -E failed")
  text = out.read_text(errors="replace")
  out.unlink()
  return Preprocessed(host=text, log=log)


def preprocess(source: str, tc: toolchain_lib.Toolchain, arch: str,
               timeout_s: float = PREPROCESS_TIMEOUT_S) -> Preprocessed:
  """The host and device preprocessing passes of `source` (as `solution.cu`) for `arch`, jailed."""
  with _job_dir(None, jailed=True) as job:
    (pathlib.Path(job) / SOURCE_NAME).write_text(source)
    host = _preprocess_pass(tc, arch, job, HOST_PASS, timeout_s)
    if host.reason is not None:
      return host
    device = _preprocess_pass(tc, arch, job, (), timeout_s)
    if device.reason is not None:
      return device
  return Preprocessed(host=host.host, device=device.host, log=host.log + device.log)


def cache_key(source: str, flags: Sequence[str], tc: toolchain_lib.Toolchain) -> str:
  h = hashlib.sha256()
  for part in (source, "\0".join(flags), tc.fingerprint):
    h.update(part.encode())
    h.update(b"\1")
  return h.hexdigest()


_EDG_DIAG = re.compile(r"^(?P<file>[^\s:()]+)\((?P<line>\d+)\): (?P<kind>error|warning|catastrophic error|remark)"
                       r"(?: #\S+)?: (?P<msg>.*)$")
_GCC_DIAG = re.compile(r"^(?P<file>[^\s:]+):(?P<line>\d+):(?:\d+:)? (?P<kind>fatal error|error|warning|note): "
                       r"(?P<msg>.*)$")
_TOOL_LINE = re.compile(r"^(nvcc|ptxas|nvlink|fatbinary|cicc|cudafe\+\+|gcc|g\+\+|cc1plus|collect2|\S*/ld|ld)\b.*"
                        r"\b(error|fatal|undefined|died|did not finish)", re.IGNORECASE)
_QUOTED = re.compile(r'"[^"]*"|\'[^\']*\'|\u2018[^\u2019]*\u2019')


def _diagnostic(line: str, prototype: str) -> tuple[str | None, bool] | None:
  """(feedback line or None, keep the lines that follow) for a compiler diagnostic; None otherwise.

  Errors in `solution.cu` keep their quoted source and caret; errors in the harness shim become a
  prototype mismatch; errors in any other file shrink to the file's name and the message with quoted
  text elided (never a line of that file). Warnings and notes are dropped.
  """
  match = _EDG_DIAG.match(line.strip()) or _GCC_DIAG.match(line.strip())
  if match is None:
    return None
  kind = match.group("kind")
  if kind in ("warning", "remark", "note"):
    return None, False
  name = pathlib.Path(match.group("file")).name
  if name == SHIM_FILENAME:
    return (f"solution() does not match the required prototype: {match.group('msg')}"
            + (f"\n  expected: {prototype}" if prototype else "")), False
  if name == SOURCE_NAME:
    return f"{SOURCE_NAME}:{match.group('line')}: {kind}: {match.group('msg')}", True
  message = _QUOTED.sub('"..."', match.group("msg"))
  return f"{name[:60]}: {kind}: {message}", False


def trim_log(log: str, prototype: str = "", max_lines: int = FEEDBACK_LINES) -> str:
  """The compiler's errors for the policy: see `_diagnostic` (an error in `solution.cu` keeps up to
  CONTEXT_LINES indented lines after it); plus the one-line errors of nvcc's tools (ptxas, the linker, a
  timeout). Nothing else of the log is echoed."""
  out: list[str] = []
  context = 0  # how many more indented lines (quoted source, caret) belong to the last kept error
  for raw in log.splitlines():
    line = raw.rstrip()
    diagnostic = _diagnostic(line, prototype)
    if diagnostic is not None:
      text, keep_context = diagnostic
      context = CONTEXT_LINES if keep_context else 0
      if text is not None:
        out.append(text)
    elif context and line.strip() and line[0] in " \t":
      context -= 1
      out.append(line)
    elif _TOOL_LINE.search(line.strip()):
      out.append(line.strip())
  if not out and re.search(r"\b(error|fatal)\b", log, re.IGNORECASE):
    out = [f"nvcc failed without an error located in {SOURCE_NAME}"]
  if len(out) > max_lines:
    out = out[:max_lines] + [f"[... {len(out) - max_lines} more lines]"]
  return "\n".join(out)


def _install(built: pathlib.Path, out_path: pathlib.Path) -> None:
  """Copies a built file into place atomically, as a new file of this process's user that every
  sandboxed reader can load (0755, whatever the umask inside the jail was)."""
  tmp = out_path.with_name(f"{out_path.name}.{os.getpid()}.tmp")
  shutil.copyfile(built, tmp)
  os.chmod(tmp, 0o755)
  os.replace(tmp, out_path)


def _run_nvcc(tc: toolchain_lib.Toolchain, flags: Sequence[str], source: str, out_path: pathlib.Path,
              timeout_s: float, jailed: bool) -> tuple[bool, str]:
  with _job_dir(str(out_path.parent), jailed) as job:
    (pathlib.Path(job) / SOURCE_NAME).write_text(source)
    try:
      proc = run_nvcc(tc, [*flags, SOURCE_NAME, "-o", "lib.so"], job, timeout_s=timeout_s, limits=COMPILE_LIMITS,
                      jailed=jailed)
    except subprocess.TimeoutExpired:
      return False, f"nvcc did not finish within {timeout_s:.0f} s"
    log = (proc.stdout + proc.stderr).replace(job + "/", "")
    if proc.returncode == 0:
      _install(pathlib.Path(job) / "lib.so", out_path)
    return proc.returncode == 0, log


def runner_flags(tc: toolchain_lib.Toolchain) -> list[str]:
  """Flags for the harness host program `runner.cu` (host C++; exports its launch interposers). The CUDA
  runtime is linked as the kernels link it, by soname (the wheel ships no unversioned libcudart.so)."""
  return ["-x", "c++", "-O2", "-std=c++17", "-cudart", "none", f"-L{tc.cudart_dir}", f"-l:{tc.cudart_soname}",
          "-ldl", "-Xlinker", "--export-dynamic", "-Xlinker", f"-rpath={tc.cudart_dir}"]


def compile_source(source: str, arch: str | None = None, tc: toolchain_lib.Toolchain | None = None,
                   cache_dir: str | os.PathLike | None = None, prototype: str = "",
                   timeout_s: float = COMPILE_TIMEOUT_S, flags: Sequence[str] | None = None,
                   suffix: str = ".so", private_dir: str | os.PathLike | None = None) -> CompileResult:
  """Compiles `source` (already including the harness shim) into a cached shared library.

  `flags` replaces `nvcc_flags(tc, arch)` (the runner program is built this way, with suffix `.exe`).
  `private_dir`: read the cache but never write it; a miss compiles into `private_dir` instead (used
  inside the sandbox, whose uid must not be able to plant libraries for later requests).
  """
  tc = tc or toolchain_lib.find_toolchain()
  if flags is None:
    flags = nvcc_flags(tc, arch or toolchain_lib.target_arch())
  key = cache_key(source, flags, tc)
  folder = pathlib.Path(cache_dir or default_cache_dir()) / key[:2]
  if private_dir is None:
    folder.mkdir(parents=True, exist_ok=True, mode=0o755)
  lib_path, meta_path = folder / f"{key}{suffix}", folder / f"{key}.json"

  def from_cache() -> CompileResult | None:
    if not meta_path.exists():
      return None
    meta = json.loads(meta_path.read_text())
    if meta["ok"] and not lib_path.exists():
      return None
    return CompileResult(meta["ok"], str(lib_path) if meta["ok"] else None, meta["log"],
                         trim_log(meta["log"], prototype), key, True, 0.0)

  hit = from_cache()
  if hit is not None:
    return hit
  if private_dir is not None:
    out_path = pathlib.Path(private_dir) / f"{key}{suffix}"
    start = time.perf_counter()
    ok, log = _run_nvcc(tc, flags, source, out_path, timeout_s, jailed=False)
    return CompileResult(ok, str(out_path) if ok else None, log, trim_log(log, prototype), key, False,
                         time.perf_counter() - start)
  with open(folder / f"{key}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    hit = from_cache()
    if hit is not None:
      return hit
    start = time.perf_counter()
    ok, log = _run_nvcc(tc, flags, source, lib_path, timeout_s, jailed=True)
    seconds = time.perf_counter() - start
    if "did not finish within" not in log:
      tmp_meta = meta_path.with_suffix(f".json.{os.getpid()}")
      tmp_meta.write_text(json.dumps({"ok": ok, "log": log, "seconds": seconds}))
      os.replace(tmp_meta, meta_path)
  return CompileResult(ok, str(lib_path) if ok else None, log, trim_log(log, prototype), key, False, seconds)


def build_runner(tc: toolchain_lib.Toolchain | None = None, cache_dir: str | os.PathLike | None = None,
                 private_dir: str | os.PathLike | None = None) -> str:
  """Path of the compiled harness host program (built once per toolchain, then cached)."""
  tc = tc or toolchain_lib.find_toolchain()
  source = (pathlib.Path(__file__).parent / "runner.cu").read_text()
  result = compile_source(source, tc=tc, cache_dir=cache_dir, flags=runner_flags(tc), suffix=".exe",
                          private_dir=private_dir)
  if not result.ok:
    raise RuntimeError(f"the harness runner does not compile with {tc.nvcc}:\n{result.log[-3000:]}")
  return result.library


def compile_many(sources: Sequence[str], arch: str | None = None, tc: toolchain_lib.Toolchain | None = None,
                 cache_dir: str | os.PathLike | None = None, prototypes: Sequence[str] | None = None,
                 max_workers: int | None = None) -> list[CompileResult]:
  """Compiles several sources in parallel (up to the core count), results in input order."""
  tc = tc or toolchain_lib.find_toolchain()
  arch = arch or toolchain_lib.target_arch()
  prototypes = prototypes or [""] * len(sources)
  workers = max_workers or os.cpu_count() or 1
  with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
    futures = [pool.submit(compile_source, s, arch, tc, cache_dir, p) for s, p in zip(sources, prototypes)]
    return [f.result() for f in futures]
