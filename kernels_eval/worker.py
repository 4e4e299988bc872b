"""A warm worker: imports JAX and the runners once, then forks one sandboxed child per job.

Started by `kernels_eval.pool` as `python -m kernels_eval.worker`. It never runs job code itself: each job
runs in a fresh child (`kernels_eval.sandbox`), so a crash, a hang or a poisoned runtime dies with that
child, and the worker answers the next job. Protocol on stdin/stdout (frames of `kernels_eval.wire`):

  parent -> worker: {"runners": {name: "module:function"}, "limits": {...}, "tmp_root": str}   (once)
  worker -> parent: {"kind": "ready", "toolchain": {...}}
  parent -> worker: {"runner": name, "timeout_s": float, "payload": {...}}                       (per job)
  worker -> parent: {"kind": "outcome", <ChildOutcome header>, "nbytes": n}, then n raw bytes: the
                    child's frames, which the parent decodes (never the worker).

A runner that fails to import is reported on each of its jobs as a "crash" message; the others work.
A runner is `run(payload, emit, tmpdir)`; it calls `sandbox.lock_down(tmpdir)` before loading untrusted
code and reports with `emit({"kind": ..., ...})`.
"""
from __future__ import annotations

import importlib
import os
import platform
import sys

from kernels_eval import sandbox
from kernels_eval import wire


def _load(spec: str):
  module, _, name = spec.partition(":")
  return getattr(importlib.import_module(module), name)


def _toolchain() -> dict[str, str]:
  import jax  # pylint: disable=import-outside-toplevel
  import jaxlib  # pylint: disable=import-outside-toplevel
  return {"python": platform.python_version(), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
          "platforms": os.environ.get("JAX_PLATFORMS", "")}


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
  limits = sandbox.Limits(**config["limits"])
  wire.write_frame(proto_out, {"kind": "ready", "toolchain": _toolchain(), "pid": os.getpid()})
  while True:
    try:
      job = wire.read_frame(proto_in)
    except EOFError:
      return
    name = job["runner"]
    if name in runners:
      outcome = sandbox.run_sandboxed(lambda emit, tmpdir: runners[name](job["payload"], emit, tmpdir),
                                      float(job["timeout_s"]), limits, config["tmp_root"])
      header, data = outcome.header(), outcome.data
    else:
      error = broken.get(name, f"unknown runner {name!r}")
      header, data = {"exit_code": 1}, wire.encode({"kind": "crash", "error": error})
    proto_out.write(wire.encode({"kind": "outcome", **header, "nbytes": len(data)}))
    proto_out.write(data)
    proto_out.flush()


if __name__ == "__main__":
  main()
