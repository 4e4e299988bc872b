"""The evaluator's result record: a fixed, versioned, JSON-serialisable schema.

Every evaluation, whatever the language or the executor, returns one `EvalResult`.
`results_to_arrays` turns a batch of them into the numpy arrays the reward functions
in `leap_jax.rewards` consume.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

import numpy as np

SCHEMA_VERSION = 1

STATUSES = ("compile_error", "runtime_error", "timeout", "wrong_output", "correct", "not_run")
STATUS_CODE = {s: i for i, s in enumerate(STATUSES)}
STAGES = ("static", "compile", "lower", "correctness", "timing")
LANGS = ("pallas", "cuda")

FEEDBACK_MAX_BYTES = 1536


@dataclasses.dataclass
class Timing:
  kernel_ms: float
  reference_ms: float
  speedup: float


@dataclasses.dataclass
class Provenance:
  source_hash: str = ""
  seed: int | None = None
  toolchain: dict[str, str] = dataclasses.field(default_factory=dict)
  durations: dict[str, float] = dataclasses.field(default_factory=dict)
  cache_hit: bool = False


@dataclasses.dataclass
class EvalResult:
  """One verdict.

  status: one of STATUSES. `not_run` means the candidate passed every stage that can
    run here (e.g. CUDA compiled, no GPU): it is never a success.
  stage: the last stage reached, one of STAGES.
  rejected_reason: set when a static or anti-hack check fired (short snake_case code).
  infra_error: set when the harness itself failed; callers retry and never penalise.
  """
  status: str
  stage: str
  task_id: str = ""
  lang: str = ""
  request_id: str = ""
  rejected_reason: str | None = None
  infra_error: str | None = None
  trials_passed: int = 0
  trials_total: int = 0
  max_abs_error: float | None = None
  max_rel_error: float | None = None
  mismatch_count: int | None = None
  first_mismatches: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  timing: Timing | None = None
  flags: list[str] = dataclasses.field(default_factory=list)
  feedback: str = ""
  provenance: Provenance = dataclasses.field(default_factory=Provenance)
  schema_version: int = SCHEMA_VERSION

  def __post_init__(self):
    if self.status not in STATUSES:
      raise ValueError(f"EvalResult.status={self.status!r} is not one of {STATUSES}")
    if self.stage not in STAGES:
      raise ValueError(f"EvalResult.stage={self.stage!r} is not one of {STAGES}")
    self.feedback = truncate_feedback(self.feedback)

  @property
  def success(self) -> bool:
    return self.status == "correct" and self.infra_error is None

  @property
  def valid(self) -> bool:
    """False when the harness failed: the sample must be excluded, not penalised."""
    return self.infra_error is None

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), sort_keys=True)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "EvalResult":
    d = dict(d)
    version = d.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
      raise ValueError(f"EvalResult schema_version {version} is not supported (expected {SCHEMA_VERSION})")
    unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise ValueError(f"EvalResult has unknown fields: {sorted(unknown)}")
    if d.get("timing") is not None:
      d["timing"] = Timing(**d["timing"])
    d["provenance"] = Provenance(**d.get("provenance", {}))
    return cls(**d)

  @classmethod
  def from_json(cls, s: str) -> "EvalResult":
    return cls.from_dict(json.loads(s))


def truncate_feedback(text: str, limit: int = FEEDBACK_MAX_BYTES) -> str:
  """Caps feedback at `limit` UTF-8 bytes, keeping the head and marking the cut. Text that is not valid
  Unicode (lone surrogates from a child's messages) has those characters replaced."""
  data = str(text).encode("utf-8", errors="replace")
  text = data.decode("utf-8")
  if len(data) <= limit:
    return text
  marker = "\n[... feedback truncated]"
  head = data[: limit - len(marker.encode())].decode("utf-8", errors="ignore")
  return head + marker


def results_to_arrays(results: Sequence[EvalResult], shape: tuple[int, ...]) -> dict[str, np.ndarray]:
  """Turns results (row-major over `shape`) into arrays for `leap_jax.rewards`.

  Returns a dict of arrays of the given shape: `success` (bool), `valid` (bool: no infra
  error), `status` (int32 code into STATUSES), `speedup` (float32, NaN where not timed).
  """
  n = int(np.prod(shape))
  if len(results) != n:
    raise ValueError(f"results_to_arrays: got {len(results)} results for shape {shape} ({n} expected)")
  success = np.array([r.success for r in results], dtype=bool)
  valid = np.array([r.valid for r in results], dtype=bool)
  status = np.array([STATUS_CODE[r.status] for r in results], dtype=np.int32)
  speedup = np.array([r.timing.speedup if r.timing else np.nan for r in results], dtype=np.float32)
  return {k: v.reshape(shape) for k, v in
          dict(success=success, valid=valid, status=status, speedup=speedup).items()}
