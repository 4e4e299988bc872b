"""A warm worker: imports JAX and the runners once, then forks one sandboxed child per job step.

Started by `kernels_eval.pool` as `python -m kernels_eval.worker`. It never runs job code itself: each
step of a job runs in a fresh child (`kernels_eval.sandbox`), so a crash, a hang or a poisoned runtime
dies with that child, and the worker answers the next job. A job's steps run one after the other in
separate children, so a reference never shares a process with candidate code. Protocol on
stdin/stdout (frames of `kernels_eval.wire`):

  parent -> worker: {"runners": {name: "module:function"}, "limits": {...}, "tmp_root": str,
                     "writable": [paths], "job_env": {...}}                                  (once)
  worker -> parent: {"kind": "ready", "toolchain": {...}, "isolation_error": str | None}
  parent -> worker: {"steps": [runner name, ...], "timeout_s": float, "payload": {...}}      (per job)
  worker -> parent: per step, as soon as it ends: {"kind": "step", <ChildOutcome header>, "runner": name,
                    "nbytes": n}, then its n raw bytes: its frames, which the parent decodes (never the
                    worker); then {"kind": "end"}. A step's bytes are sent and wiped from the worker's
                    memory before the next step's child is forked, so no child inherits another's report.

`timeout_s` bounds the whole job; a step that times out ends the job (later steps are not run). The first
step may write up to `FIRST_STEP_OUTPUT_CAP` bytes of frames; each later step at most twice what the first did
(`later_step_cap`; an evaluation's first step is the reference, and a candidate's outputs have the
reference's shapes, so the cap scales with the task, timing sizes included). On a GPU machine the worker opens
the GPU lock (`gpu_lock`) once and every child inherits it. A runner
that fails to import is reported on each of its steps as a "crash" message; the others work. A runner is
`run(payload, emit, tmpdir)` and reports with `emit({"kind": ..., ...})`; one that loads untrusted code
calls `sandbox.lock_down(tmpdir)` first.
"""
from __future__ import annotations

import dataclasses
import glob
import importlib
import os
import pathlib
import platform
import sys
import time

from kernels_eval import gpu_lock
from kernels_eval import sandbox
from kernels_eval import wire

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[1]
# Broad folders never bound into a job's view, even when they are on sys.path.
SHARED = frozenset({"/", "/tmp", "/var/tmp", "/home", "/root", os.path.realpath(os.path.expanduser("~"))})
# Imported here once, so that jobs neither pay for them nor read their files lazily from inside the jail.
PRELOAD = ("jax.experimental.pallas", "jax.experimental.pallas.triton", "jax._src.pallas.triton.lowering",
           "jax._src.pallas.pallas_call", "jaxlib.mlir.dialects.mhlo", "jaxlib.mlir.dialects.stablehlo",
           "jax._src.interpreters.mlir", "numpy.linalg", "ml_dtypes")
FIRST_STEP_OUTPUT_CAP = 1 << 30


def _load(spec: str):
  module, _, name = spec.partition(":")
  return getattr(importlib.import_module(module), name)


def _toolchain() -> dict[str, str]:
  import jax  # pylint: disable=import-outside-toplevel
  import jaxlib  # pylint: disable=import-outside-toplevel
  return {"python": platform.python_version(), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
          "platforms": os.environ.get("JAX_PLATFORMS", "")}


def _readable_roots() -> list[str]:
  """The folders a job reads: the interpreter, the virtualenv, sys.path, the CUDA toolkit and caches.

  The project checkout itself is not one: only its `kernels_eval` package is (not workdirs, not .git).
  Nor are shared folders that land on `sys.path` by accident (a script run from /tmp or a home).
  """
  roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path}
  roots |= set(os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep))
  roots |= {os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", os.environ.get("KERNELS_EVAL_CACHE_DIR", "")}
  project = str(PACKAGE_ROOT)
  out = set()
  for root in roots:
    if not root or not os.path.isabs(root) or not os.path.exists(root) or os.path.realpath(root) in SHARED:
      continue
    if os.path.realpath(root) == project and "-packages" not in project:
      root = str(PACKAGE_ROOT / "kernels_eval")
    out.add(root)
  return sorted(out)


def job_view(config: dict) -> sandbox.View:
  """What every job of this worker sees (namespaces isolation)."""
  devices = tuple(sorted(glob.glob("/dev/nvidia*")))
  readable = tuple(_readable_roots()) + (("/sys",) if devices else ())
  return sandbox.View(readable=readable, writable=tuple(config.get("writable", ())), devices=devices,
                      env=tuple(sorted(config.get("job_env", {}).items())))


def _self_test(roots: tuple[str, ...], emit, tmpdir: str) -> None:
  """In a jail: every folder of the view (the compile cache too) and every already-imported module file
  must be readable there (the same files a job's lazy imports and tracebacks read)."""
  del tmpdir
  files = [getattr(m, "__file__", None) for m in list(sys.modules.values())]
  checks = [(root, os.listdir) for root in roots] + [(path, _read_byte) for path in files
                                                      if path and os.path.isabs(path)]
  for path, check in checks:
    try:
      check(path)
    except OSError as e:
      emit({"kind": "unreadable", "path": path, "error": e.strerror})
      return
  emit({"kind": "ok"})


def _read_byte(path: str) -> None:
  with open(path, "rb") as f:
    f.read(1)


def _isolation_error(limits: sandbox.Limits, view: sandbox.View, tmp_root: str) -> str | None:
  """None when a jailed child works and can read what jobs need, else what is wrong and how to fix it."""
  roots = tuple(r for r in view.readable + view.writable if os.path.isdir(r))
  outcome = sandbox.run_sandboxed(lambda emit, tmpdir: _self_test(roots, emit, tmpdir), 60.0, limits, view,
                                  tmp_root)
  messages, _ = wire.split_frames(outcome.data)
  if messages and messages[-1].get("kind") == "ok":
    return None
  if messages and messages[-1].get("kind") == "unreadable":
    path = messages[-1]["path"]
    return (f"a sandboxed job (uid {limits.uid if os.geteuid() == 0 else os.getuid()}) cannot read {path} "
            f"({messages[-1]['error']}): jobs need the interpreter, the virtualenv, this package and the CUDA "
            "compile cache (KERNELS_EVAL_CACHE_DIR) to be readable by that uid (e.g. `chmod -R o+rX` on it), "
            "or run as that user")
  if messages and messages[-1].get("kind") == "crash":
    return f"a sandboxed job failed to start: {messages[-1]['error'][-600:]}"
  return f"a sandboxed job failed to start (exit {outcome.exit_code}, signal {outcome.signal}); see the worker log"


def later_step_cap(first_step_bytes: int) -> int:
  """The output cap of a job's steps after the first: twice the first's frames plus 1 MiB (an output of the
  wrong shape still gets its `wrong_output` verdict unless it is over twice the reference's size)."""
  return 2 * first_step_bytes + (1 << 20)


def _run_steps(job: dict, runners: dict, broken: dict, limits: sandbox.Limits, view: sandbox.View,
               tmp_root: str, keep_fds: tuple[int, ...], out) -> None:
  deadline = time.monotonic() + float(job["timeout_s"])
  cap = FIRST_STEP_OUTPUT_CAP
  for i, name in enumerate(job["steps"]):
    if name in runners:
      outcome = sandbox.run_sandboxed(
          lambda emit, tmpdir, fn=runners[name]: fn(job["payload"], emit, tmpdir),
          max(deadline - time.monotonic(), 0.1), limits, view, tmp_root, keep_fds=keep_fds, max_output=cap)
      header, data = outcome.header(), outcome.data
    else:
      error = broken.get(name, f"unknown runner {name!r}")
      header, data = {"exit_code": 1}, bytearray(wire.encode({"kind": "crash", "error": error}))
    if i == 0:
      cap = later_step_cap(len(data))
    out.write(wire.encode({"kind": "step", **header, "runner": name, "nbytes": len(data)}))
    out.write(data)
    out.flush()
    sandbox.wipe(data)
    if header.get("timed_out") or header.get("memory_killed") or header.get("truncated"):
      break
  out.write(wire.encode({"kind": "end"}))
  out.flush()


def main() -> None:
  proto_out = os.fdopen(os.dup(1), "wb")
  os.dup2(2, 1)
  proto_in = sys.stdin.buffer
  config = wire.read_frame(proto_in)
  runners, broken = {}, {}
  for name, spec in config["runners"].items():
    try:
      runners[name] = _load(spec)
    except Exception as e:  # noqa: BLE001  (reported per job; the other runners keep working)
      broken[name] = f"runner {name} ({spec}) failed to load: {e!r}"
  for module in PRELOAD:
    try:
      importlib.import_module(module)
    except ImportError:
      pass
  limits = sandbox.Limits(**config["limits"])
  view = job_view(config)
  keep_fds = gpu_lock.open_fds() if view.devices else ()
  if keep_fds:
    view = dataclasses.replace(view, env=view.env + ((gpu_lock.FDS_ENV, ",".join(map(str, keep_fds))),))
  error = _isolation_error(limits, view, config["tmp_root"])
  wire.write_frame(proto_out, {"kind": "ready", "toolchain": _toolchain(), "pid": os.getpid(),
                               "isolation_error": error})
  while True:
    try:
      job = wire.read_frame(proto_in)
    except EOFError:
      return
    _run_steps(job, runners, broken, limits, view, config["tmp_root"], keep_fds, proto_out)


if __name__ == "__main__":
  main()
