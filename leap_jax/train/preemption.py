"""Clean stops on SIGTERM: a handler sets a flag, the training loop checks it, checkpoints and exits."""
from __future__ import annotations

import signal
import types
from typing import Optional, Sequence

import jax
import numpy as np


class StopRequest:
  """Records termination signals instead of dying on them.

  Usage:
    with StopRequest() as stop:
      for step in ...:
        ...
        if stop.requested_anywhere():
          checkpointer.save(step, ..., force=True)
          break
  """

  def __init__(self, signals: Sequence[int] = (signal.SIGTERM,)):
    self.signals = tuple(signals)
    self.received: Optional[int] = None
    self._previous = {}

  def __enter__(self) -> "StopRequest":
    for sig in self.signals:
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous.clear()

  def _handle(self, signum: int, frame: Optional[types.FrameType]) -> None:
    del frame
    self.received = signum

  @property
  def requested(self) -> bool:
    """Whether this process received one of the signals."""
    return self.received is not None

  def requested_anywhere(self) -> bool:
    """Whether any process received one (a collective: every process must call it at the same step)."""
    if jax.process_count() == 1:
      return self.requested
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    flags = multihost_utils.process_allgather(np.asarray(self.requested, np.int32))
    return bool(np.any(flags))
