"""Per-step metrics: TensorBoard events, an append-only `metrics.jsonl`, and a tqdm progress bar."""
from __future__ import annotations

import json
import math
import os
from typing import Mapping, Optional, Sequence

import numpy as np
import tqdm

METRICS_FILE = "metrics.jsonl"
DEFAULT_BAR_KEYS = ("loss", "reward/mean", "pass_rate/turn_1", "clip_fraction", "logprob_gap", "time/step")


def _scalar(name: str, value) -> Optional[float]:
  """float(value), or None for NaN/inf (written as JSON null); non-scalars raise ValueError."""
  if isinstance(value, (str, bytes)):
    raise ValueError(f"metric {name!r} must be a number, got {value!r}")
  try:
    array = np.asarray(value, dtype=np.float64)
  except (TypeError, ValueError) as e:
    raise ValueError(f"metric {name!r} must be a number, got {type(value).__name__}") from e
  if array.size != 1:
    raise ValueError(f"metric {name!r} must be a scalar, got shape {array.shape}")
  v = float(array.reshape(()))
  return v if math.isfinite(v) else None


def read_metrics(workdir: str | os.PathLike) -> list[dict]:
  """The records of `<workdir>/metrics.jsonl` in order (null values become NaN).

  After a resume, steps logged again replace the earlier records of the same step.
  """
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"no {METRICS_FILE} in {workdir}")
  by_step = {}
  with open(path) as f:
    for line in f:
      if line.strip():
        record = json.loads(line)
        by_step[record["step"]] = {k: (math.nan if v is None else v) for k, v in record.items()}
  return [by_step[s] for s in sorted(by_step)]


class MetricsWriter:
  """Writes one record per step to every enabled sink; only process 0 should pass enabled=True.

  Usage:
    with MetricsWriter(workdir, total_steps=n, initial_step=start) as writer:
      writer.write(step, {"loss": 0.3, "reward/mean": 0.1})
  """

  def __init__(self, workdir: str | os.PathLike, *, tensorboard: bool = True, progress_bar: bool = True,
               total_steps: Optional[int] = None, initial_step: int = 0,
               bar_keys: Sequence[str] = DEFAULT_BAR_KEYS, enabled: bool = True):
    self.workdir = os.fspath(workdir)
    self.enabled = enabled
    self.bar_keys = tuple(bar_keys)
    self._tb = None
    self._bar = None
    self._file = None
    if not enabled:
      return
    os.makedirs(self.workdir, exist_ok=True)
    self._file = open(os.path.join(self.workdir, METRICS_FILE), "a")
    if tensorboard:
      import tensorboardX  # pylint: disable=g-import-not-at-top
      self._tb = tensorboardX.SummaryWriter(os.path.join(self.workdir, "tb"))
    if progress_bar:
      # disable=None: no bar when stderr is not a terminal (logs keep the per-step lines instead).
      self._bar = tqdm.tqdm(total=total_steps, initial=initial_step, dynamic_ncols=True, desc="train", disable=None)

  def write(self, step: int, metrics: Mapping[str, object]) -> None:
    """Logs `metrics` (name -> scalar) at `step`."""
    values = {name: _scalar(name, v) for name, v in metrics.items()}
    if not self.enabled:
      return
    self._file.write(json.dumps({"step": int(step), **values}, sort_keys=True) + "\n")
    self._file.flush()
    if self._tb is not None:
      for name, v in values.items():
        if v is not None:
          self._tb.add_scalar(name, v, int(step))
      self._tb.flush()
    if self._bar is not None:
      self._bar.update(max(int(step) - self._bar.n, 0))
      shown = {k: f"{values[k]:.4g}" for k in self.bar_keys if values.get(k) is not None}
      self._bar.set_postfix(shown, refresh=True)

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    if self._bar is not None:
      self._bar.close()
      self._bar = None

  def __enter__(self) -> "MetricsWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
