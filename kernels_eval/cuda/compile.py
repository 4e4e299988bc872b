"""Compiling candidate CUDA source into a shared library, with a cross-process compile cache.

Every candidate is built with the same fixed flags (`nvcc_flags`): `-O3 -std=c++17 -lineinfo`, one
architecture, position-independent code, and the CUDA runtime linked dynamically (`-cudart none
-l:libcudart.so.13`, the toolkit's soname) so the symbol audit sees every runtime call.

Cache: key = sha256(source, flags, toolchain fingerprint). The library and a JSON record (success,
log) live under `<cache_dir>/<key[:2]>/`. A per-key `flock` makes concurrent processes compile a key
once; results are written to a temporary name and `os.replace`d into place, so readers never see a
partial file. A failed compile is cached as well (its log is the feedback).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import fcntl
import hashlib
import json
import os
import pathlib
import re
import subprocess
import tempfile
import time
from typing import Sequence

from kernels_eval.cuda import toolchain as toolchain_lib
from kernels_eval.cuda.prototype import SHIM_FILENAME

CACHE_ENV = "KERNELS_EVAL_CACHE_DIR"
SOURCE_NAME = "solution.cu"
COMPILE_TIMEOUT_S = 180.0
FEEDBACK_LINES = 24


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


def cache_key(source: str, flags: Sequence[str], tc: toolchain_lib.Toolchain) -> str:
  h = hashlib.sha256()
  for part in (source, "\0".join(flags), tc.fingerprint):
    h.update(part.encode())
    h.update(b"\1")
  return h.hexdigest()


_DIAG = re.compile(r"^(?P<file>[^\s:()]+)\((?P<line>\d+)\): (?P<kind>error|warning|catastrophic error)"
                   r"(?: #\S+)?: (?P<msg>.*)$")


def trim_log(log: str, prototype: str = "", max_lines: int = FEEDBACK_LINES) -> str:
  """Keeps nvcc's errors (file:line, message, the quoted source line and caret), drops warnings.

  Paths become `solution.cu`; errors inside the harness entry shim become a prototype mismatch.
  """
  out: list[str] = []
  keep_context = False
  for raw in log.splitlines():
    line = raw.rstrip()
    match = _DIAG.match(line.strip())
    if match:
      keep_context = match.group("kind") != "warning"
      if not keep_context:
        continue
      name = pathlib.Path(match.group("file")).name
      if name == SHIM_FILENAME:
        out.append(f"solution() does not match the required prototype: {match.group('msg')}"
                   + (f"\n  expected: {prototype}" if prototype else ""))
        keep_context = False
        continue
      out.append(f"{SOURCE_NAME}:{match.group('line')}: {match.group('kind')}: {match.group('msg')}")
    elif keep_context and line.strip() and not line.startswith("Remark"):
      if re.match(r"^\d+ errors? detected", line.strip()):
        keep_context = False
        continue
      out.append(line)
    elif re.search(r"\b(ptxas|nvlink|ld)\b.*(error|undefined)", line, re.IGNORECASE):
      out.append(line.strip())
  if not out:
    tail = [ln for ln in log.splitlines() if ln.strip() and "warning" not in ln.lower()][-max_lines:]
    out = tail
  if len(out) > max_lines:
    out = out[:max_lines] + [f"[... {len(out) - max_lines} more lines]"]
  return "\n".join(out)


def _run_nvcc(tc: toolchain_lib.Toolchain, flags: Sequence[str], source: str, out_path: pathlib.Path,
              timeout_s: float) -> tuple[bool, str]:
  with tempfile.TemporaryDirectory(prefix="nvcc_", dir=out_path.parent) as tmp:
    src = pathlib.Path(tmp) / SOURCE_NAME
    src.write_text(source)
    lib = pathlib.Path(tmp) / "lib.so"
    cmd = [tc.nvcc, *flags, str(src), "-o", str(lib)]
    try:
      proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=tc.env(), cwd=tmp,
                            check=False)
    except subprocess.TimeoutExpired:
      return False, f"nvcc did not finish within {timeout_s:.0f} s"
    log = (proc.stdout + proc.stderr).replace(tmp + "/", "")
    if proc.returncode == 0:
      os.replace(lib, out_path)
    return proc.returncode == 0, log


def runner_flags(tc: toolchain_lib.Toolchain) -> list[str]:
  """Flags for the harness host program `runner.cu` (host C++; exports its launch interposers)."""
  return ["-x", "c++", "-O2", "-std=c++17", "-cudart", "shared", "-ldl", "-Xlinker", "--export-dynamic",
          f"-L{tc.cudart_dir}", "-Xlinker", f"-rpath={tc.cudart_dir}"]


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
    ok, log = _run_nvcc(tc, flags, source, out_path, timeout_s)
    return CompileResult(ok, str(out_path) if ok else None, log, trim_log(log, prototype), key, False,
                         time.perf_counter() - start)
  with open(folder / f"{key}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    hit = from_cache()
    if hit is not None:
      return hit
    start = time.perf_counter()
    ok, log = _run_nvcc(tc, flags, source, lib_path, timeout_s)
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
