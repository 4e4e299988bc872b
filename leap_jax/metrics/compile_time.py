"""Seconds JAX spends compiling: lowering to MLIR plus XLA compilation (or a persistent-cache read).

One process-wide listener on JAX's monitoring events adds up their durations; callers take differences of
`compile_seconds()` around the work they time, to report compile time apart from run time.
"""
from __future__ import annotations

import threading

from jax import monitoring

_EVENTS = frozenset({"/jax/core/compile/jaxpr_to_mlir_module_duration", "/jax/core/compile/backend_compile_duration"})
_lock = threading.Lock()
_total = 0.0


def _listen(event: str, duration: float, **_) -> None:
  global _total
  if event in _EVENTS:
    with _lock:
      _total += duration


monitoring.register_event_duration_secs_listener(_listen)


def compile_seconds() -> float:
  """Compile seconds of this process so far (since this module was imported)."""
  return _total
