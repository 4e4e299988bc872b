"""The labelled corpus: generated tasks, K solver attempts each, frontier labels; durable and resumable.

For task index i of a corpus with seed S, the per-task seed is `task_seed(S, i)` and everything random about
task i (its generation, its solver attempts) derives from it, so a resumed build equals an uninterrupted one.

Labels: s = number of passing attempts out of K, y = 1[a <= s <= b] (the frontier band, default 1..3 of 8).
Invalid tasks are recorded with their reason and no label. The stored labels use the band the corpus was built
with (meta.json); `with_band` recomputes them from the stored pass counts for another band.

Storage (`<out_dir>`): `meta.json` (the corpus definition: generator, solver checkpoint, pass definition,
evaluator version, seeds, K, band; written once, checked on every resume) and `records.jsonl`, one JSON record
per task index, appended, flushed and fsync'ed as each task finishes. A torn last line (a crash mid-write) is
ignored and its task redone.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Protocol, Sequence

import numpy as np

from probe import generator as generator_lib

META = "meta.json"
RECORDS = "records.jsonl"


def task_seed(corpus_seed: int, index: int) -> int:
  """A 31-bit seed for task `index` of corpus `corpus_seed` (numpy SeedSequence of the pair)."""
  return int(np.random.SeedSequence([int(corpus_seed), int(index)]).generate_state(1)[0] & 0x7FFFFFFF)


def _checked_band(band: tuple[int, int]) -> tuple[int, int]:
  a, b = band
  if not 0 <= a <= b:
    raise ValueError(f"band {band} must satisfy 0 <= a <= b")
  return a, b


def in_band(passes: int, band: tuple[int, int]) -> bool:
  return band[0] <= passes <= band[1]


class TaskSource(Protocol):
  """Writes generator replies; reply j must depend only on seeds[j]."""

  def generate(self, seeds: Sequence[int]) -> list[str]:
    ...


class Solver(Protocol):
  """Runs K attempts on a task; `metadata` names the checkpoint, sampling and pass definition."""
  metadata: dict[str, Any]

  def attempts(self, task, seed: int, index: int) -> list[bool]:
    ...


@dataclasses.dataclass
class Record:
  """One corpus entry. passes/label are None for invalid tasks."""
  index: int
  seed: int
  reply: str
  text: str
  valid: bool
  reason: str
  family: str
  norm_hash: str
  passes: int | None = None
  attempts: int | None = None
  label: int | None = None

  @property
  def solve_rate(self) -> float | None:
    return None if self.passes is None else self.passes / self.attempts


def read_records(out_dir: str | os.PathLike) -> list[Record]:
  """Complete records of a corpus, by index (a torn final line is skipped)."""
  path = pathlib.Path(out_dir) / RECORDS
  if not path.is_file():
    return []
  records = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      if not line.endswith("\n"):
        break
      rec = Record(**json.loads(line))
      records[rec.index] = rec
  return [records[i] for i in sorted(records)]


def read_meta(out_dir: str | os.PathLike) -> dict[str, Any]:
  return json.loads((pathlib.Path(out_dir) / META).read_text())


def _write_meta(out_dir: pathlib.Path, meta: dict[str, Any]) -> None:
  path = out_dir / META
  canonical = json.loads(json.dumps(meta, sort_keys=True))
  if path.is_file():
    old = json.loads(path.read_text())
    if old != canonical:
      diff = sorted(k for k in set(old) | set(canonical) if old.get(k) != canonical.get(k))
      raise ValueError(f"{out_dir} holds a corpus with different metadata (fields {diff}); use a new out_dir")
    return
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps(canonical, sort_keys=True, indent=1))
  os.replace(tmp, path)


def _truncate_torn_tail(path: pathlib.Path) -> None:
  if not path.is_file():
    return
  data = path.read_bytes()
  end = data.rfind(b"\n") + 1
  if end != len(data):
    with open(path, "r+b") as f:
      f.truncate(end)


def build_corpus(out_dir: str | os.PathLike, *, source: TaskSource, solver: Solver,
                 checker: generator_lib.TaskChecker, num_tasks: int, seed: int, band: tuple[int, int] = (1, 3),
                 batch_size: int = 8, metadata: dict[str, Any] | None = None, log=print) -> list[Record]:
  """Builds (or resumes) a corpus of `num_tasks` records in `out_dir`; returns all records by index.

  Args:
    out_dir: corpus folder (created).
    source: the frozen generator.
    solver: the solver whose attempts label valid tasks.
    checker: validity checks; valid tasks of earlier indices count as known for the duplicate check.
    num_tasks: N.
    seed: corpus seed S.
    band: (a, b) inclusive pass counts of the frontier.
    batch_size: generations per generator call.
    metadata: extra fields for meta.json (generator, evaluator version, config).
  """
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  a, b = _checked_band(band)
  _write_meta(out, {**(metadata or {}), "seed": int(seed), "num_tasks": int(num_tasks), "band": [a, b],
                    "solver": solver.metadata})
  path = out / RECORDS
  _truncate_torn_tail(path)
  done = {r.index: r for r in read_records(out)}
  for r in sorted(done.values(), key=lambda r: r.index):
    if r.valid:
      checker.known.add(r.norm_hash)
  pending = [i for i in range(num_tasks) if i not in done]
  if done:
    log(f"corpus: resuming, {len(done)} of {num_tasks} tasks already recorded")
  with open(path, "a", encoding="utf-8") as f:
    for start in range(0, len(pending), batch_size):
      chunk = pending[start:start + batch_size]
      seeds = [task_seed(seed, i) for i in chunk]
      replies = source.generate(seeds)
      for index, s, reply in zip(chunk, seeds, replies):
        checked = checker.check(generator_lib.extract_task_source(reply))
        rec = Record(index=index, seed=s, reply=reply, text=checked.text, valid=checked.valid,
                     reason=checked.reason, family=checked.family, norm_hash=checked.norm_hash)
        if checked.valid:
          results = solver.attempts(checked.task, s, index)
          rec.passes, rec.attempts = int(sum(results)), len(results)
          rec.label = int(in_band(rec.passes, band))
        f.write(json.dumps(dataclasses.asdict(rec), sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
        done[index] = rec
        log(f"corpus: task {index}: " + (f"passes {rec.passes}/{rec.attempts} label {rec.label}" if rec.valid
                                         else f"invalid ({rec.reason[:120]})"))
  return [done[i] for i in sorted(done)]


def with_band(records: Sequence[Record], band: tuple[int, int]) -> list[Record]:
  """The records with labels y = 1[a <= s <= b] recomputed from their stored pass counts for `band` (no solver
  runs: another band is a choice about the same measurements). Invalid records are returned unchanged."""
  _checked_band(band)
  return [dataclasses.replace(r, label=int(in_band(r.passes, band))) if r.valid else r for r in records]


def corpus_summary(records: Sequence[Record]) -> dict[str, float]:
  """Validity, in-band share (of all and of valid tasks), all-solved share and mean solve rate."""
  n = len(records)
  valid = [r for r in records if r.valid]
  out = {"tasks": n, "valid": len(valid), "validity": len(valid) / n if n else float("nan")}
  if valid:
    out["in_band_of_valid"] = float(np.mean([r.label for r in valid]))
    out["frontier_utility"] = sum(r.label for r in valid) / n
    out["all_solved_share"] = float(np.mean([r.passes == r.attempts for r in valid]))
    out["mean_solve_rate"] = float(np.mean([r.solve_rate for r in valid]))
  return out


class RecordedSource:
  """Replays the replies of an existing corpus by seed (for relabelling with a newer solver)."""

  def __init__(self, records: Sequence[Record]):
    self.replies = {r.seed: r.reply for r in records}

  def generate(self, seeds: Sequence[int]) -> list[str]:
    missing = [s for s in seeds if s not in self.replies]
    if missing:
      raise ValueError(f"the recorded corpus has no reply for seeds {missing[:5]}; relabel with the same "
                       "corpus seed and at most its num_tasks")
    return [self.replies[s] for s in seeds]
