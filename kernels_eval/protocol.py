"""What the parent accepts from a job's steps: frames in the order the harness writes them, nothing else.

A job has two steps, each its own sandboxed child (`kernels_eval.worker`):

reference (never runs candidate code; trusted: anything wrong here is the task's or the harness's)
    env?  reference{outputs: n arrays}  timing_reference{output, reference_ms}?  done{durations}
    | reference_error{feedback}  | crash{error}

candidate (runs candidate code: everything it sends is the candidate's claim)
    env?  stage:compile  [stage:lower]  ( done                                  stages="compile"
                                        | not_run  done                         passed what runs here
                                        | stage:correctness  output{trial=0..n-1}
                                          [stage:timing  timing_output  timing{kernel_ms}]  done )
    with error{status, stage} or crash{error} ending it anywhere after stage:compile.

Stages only move forward; `timing` only when timing was requested and the job ran on a GPU, once;
`done` comes last and only when everything due came. The harness writes `stage:compile` before it loads
any candidate code, so a candidate step that ends before it failed for the harness's reasons (an
infrastructure error); from then on, a frame out of order, of an unknown kind or with bad fields, or
missing frames, are a `protocol_violation` charged to the candidate, never an infrastructure error.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

CANDIDATE_STAGES = ("compile", "lower", "correctness", "timing")
ERROR_STATUSES = ("compile_error", "runtime_error", "wrong_output", "timeout")


class Violation(Exception):
  """A frame the protocol does not allow at that point."""


_BAD_FIELD = (Violation, TypeError, ValueError, AttributeError, ArithmeticError)
MAX_TEXT = 1 << 16


def _text(value: Any) -> str:
  """A child's text as valid Unicode (lone surrogates replaced), at most MAX_TEXT characters."""
  return str(value)[:MAX_TEXT].encode("utf-8", errors="replace").decode("utf-8")


@dataclasses.dataclass(frozen=True)
class Expect:
  """What a job was asked for. timing: timing was requested and the worker has a GPU."""
  n_trials: int
  stages: str
  timing: bool


@dataclasses.dataclass
class ReferenceReport:
  outputs: list[np.ndarray] | None = None
  timing_output: np.ndarray | None = None
  reference_ms: float | None = None
  error: str | None = None
  platform: str = ""
  durations: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class CandidateReport:
  """started: the harness reached `stage:compile`. stage: the last stage entered. ended_by: how the step
  ended ("done", "error", "crash", "not_run" or None when it stopped without a last frame)."""
  started: bool = False
  stage: str = "compile"
  platform: str = ""
  error: dict[str, Any] | None = None
  crash: str | None = None
  outputs: list[np.ndarray] = dataclasses.field(default_factory=list)
  not_run: dict[str, Any] | None = None
  timing_output: np.ndarray | None = None
  timing: dict[str, Any] | None = None
  durations: dict[str, float] = dataclasses.field(default_factory=dict)
  ended_by: str | None = None
  violation: str | None = None


def _durations(msg: dict[str, Any]) -> dict[str, float]:
  d = msg.get("durations", {})
  if not isinstance(d, dict) or len(d) > 32:
    raise Violation("durations must be a mapping of at most 32 stages")
  out = {}
  for k, v in d.items():
    if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e9 and math.isfinite(v):
      out[_text(k)[:64]] = float(v)
  return out


def _array(msg: dict[str, Any], key: str) -> np.ndarray:
  value = msg.get(key)
  if not isinstance(value, np.ndarray):
    raise Violation(f"`{msg.get('kind')}` carries no array in {key!r}")
  return value


def _platform(msg: dict[str, Any]) -> str:
  if msg.get("platform") not in ("cpu", "gpu"):
    raise Violation(f"unknown platform {msg.get('platform')!r}")
  return msg["platform"]


def read_reference(messages: list[Any], expect: Expect) -> ReferenceReport:
  """The reference step's report; a malformed one is reported as `error` (an infrastructure error)."""
  report = ReferenceReport()
  try:
    for i, msg in enumerate(messages):
      kind = msg.get("kind") if isinstance(msg, dict) else None
      if kind == "env" and i == 0:
        report.platform = _platform(msg)
      elif kind == "reference" and report.outputs is None:
        outs = msg.get("outputs")
        if not (isinstance(outs, list) and len(outs) == expect.n_trials
                and all(isinstance(o, np.ndarray) for o in outs)):
          raise Violation(f"reference outputs: expected {expect.n_trials} arrays")
        report.outputs = outs
      elif kind == "timing_reference" and report.outputs is not None and report.timing_output is None:
        report.timing_output = _array(msg, "output")
        report.reference_ms = _positive_ms(msg.get("reference_ms"))
      elif kind == "done" and report.outputs is not None and i == len(messages) - 1:
        report.durations = _durations(msg)
        return report
      elif kind == "reference_error":
        report.error = f"task reference failed: {_text(msg.get('feedback', ''))}"
        return report
      elif kind == "crash":
        report.error = f"the reference step crashed: {_text(msg.get('error', ''))}"
        return report
      else:
        raise Violation(f"unexpected `{_text(kind)[:40]}` frame at position {i}")
  except _BAD_FIELD as e:
    report.error = f"the reference step broke the protocol: {e}"
    return report
  report.error = "the reference step ended before reporting its outputs" if report.outputs is None else (
      "the reference step ended without `done`")
  return report


class _CandidateReader:
  """The candidate grammar as a state machine; `feed` raises Violation on the first bad frame."""

  def __init__(self, expect: Expect):
    self.expect = expect
    self.r = CandidateReport()

  def _stage(self, msg: dict[str, Any]) -> None:
    stage = msg.get("stage")
    if stage not in CANDIDATE_STAGES:
      raise Violation(f"unknown stage {stage!r}")
    order = CANDIDATE_STAGES.index
    if not self.r.started:
      if stage != "compile":
        raise Violation(f"stage {stage!r} before compile")
      self.r.started = True
      return
    if order(stage) <= order(self.r.stage) or self.r.not_run is not None:
      raise Violation(f"stage {stage!r} after {self.r.stage!r}")
    if stage == "correctness" and self.expect.stages == "compile":
      raise Violation("correctness was not requested")
    if stage == "timing" and (not self.expect.timing or len(self.r.outputs) != self.expect.n_trials):
      raise Violation("timing was not requested on a GPU, or came before every trial's output")
    self.r.stage = stage

  def _end(self, kind: str, msg: dict[str, Any]) -> None:
    r = self.r
    if kind == "error":
      if msg.get("status") not in ERROR_STATUSES or msg.get("stage") != r.stage:
        raise Violation(f"error frame with status {_text(msg.get('status'))[:40]!r} in stage "
                        f"{_text(msg.get('stage'))[:40]!r}")
      reason = msg.get("rejected_reason")
      r.error = {"status": msg["status"], "stage": msg["stage"], "feedback": _text(msg.get("feedback", "")),
                 "rejected_reason": _text(reason)[:64] if isinstance(reason, str) else None}
    elif kind == "crash":
      r.crash = _text(msg.get("error", ""))
    elif kind == "done":
      if r.not_run is None and self.expect.stages != "compile":
        if r.stage == "compile" or len(r.outputs) != self.expect.n_trials:
          raise Violation(f"done after {len(r.outputs)} of {self.expect.n_trials} outputs")
        if r.stage == "timing" and (r.timing is None or r.timing_output is None):
          raise Violation("done in stage timing without a timing and its output")
      r.durations = _durations(msg)
    r.ended_by = kind

  def feed(self, msg: Any) -> None:
    r = self.r
    kind = msg.get("kind") if isinstance(msg, dict) else None
    if r.ended_by is not None:
      raise Violation(f"`{kind}` frame after the step ended ({r.ended_by})")
    if kind == "env" and not r.started and not r.platform:
      r.platform = _platform(msg)
    elif kind == "stage":
      self._stage(msg)
    elif not r.started:
      raise Violation(f"`{kind}` frame before stage compile")
    elif kind == "output" and r.stage == "correctness" and msg.get("trial") == len(r.outputs):
      r.outputs.append(_array(msg, "output"))
    elif kind == "not_run" and r.not_run is None and r.stage != "timing":
      r.not_run = {"stage": r.stage, "feedback": _text(msg.get("feedback", ""))}
    elif kind == "timing_output" and r.stage == "timing" and r.timing_output is None:
      r.timing_output = _array(msg, "output")
    elif kind == "timing" and r.stage == "timing" and r.timing is None and r.timing_output is not None:
      r.timing = _timing(msg)
    elif kind in ("error", "crash", "done"):
      self._end(kind, msg)
    else:
      raise Violation(f"unexpected `{_text(kind)[:40]}` frame in stage {r.stage}")


def _positive_ms(value: Any) -> float:
  if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1e9):
    raise Violation(f"a time must be positive milliseconds below 1e9 (got {_text(value)[:40]})")
  return float(value)


def _timing(msg: dict[str, Any]) -> dict[str, Any]:
  flags = msg.get("flags", [])
  if not (isinstance(flags, list) and len(flags) <= 8 and all(isinstance(f, str) for f in flags)):
    raise Violation("timing flags must be a list of at most 8 strings")
  return {"kernel_ms": _positive_ms(msg.get("kernel_ms")), "flags": [_text(f)[:64] for f in flags]}


def read_candidate(messages: list[Any], expect: Expect) -> CandidateReport:
  """The candidate step's report; the first frame the grammar refuses sets `violation` and ends it."""
  reader = _CandidateReader(expect)
  for msg in messages:
    try:
      reader.feed(msg)
    except _BAD_FIELD as e:
      reader.r.violation = _text(e)[:300]
      break
  return reader.r
