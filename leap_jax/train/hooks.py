"""Hooks: what runs after a training step on its own schedule (metrics, episode dumps, held-out evaluation,
checkpoints, progress lines), registered on a `Hooks` list the loop calls once per step.

    hooks = Hooks()
    hooks.add("metrics", lambda info: writer.write(info.step - 1, info.metrics))
    hooks.add("checkpoint", save, every=50, at_last=True)
    ... for each step: hooks.run(StepInfo(step=done, state=state, metrics=metrics, batch=batch, final=...))

Hooks run in the order they were added; a hook may add entries to `info.metrics` for the hooks after it
(the held-out hook adds `heldout/Acc@k` before the metrics hook writes the row).
"""
from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Any, Callable, Sequence

from leap_jax.metrics import curves
from leap_jax.rollout.harness import STATUS_NAMES, RolloutBatch
from leap_jax.sampling import ChatFormat


@dataclasses.dataclass
class StepInfo:
  """What a hook sees: `step` steps are done (0 before the first), with the state and metrics after them.

  batch: the last step's rollout (None before the first step); final: the end of the run's schedule;
  stop_requested: asked once, when a hook or the loop first needs `stopping` (after the hooks before it ran).
  """
  step: int
  state: Any
  metrics: dict[str, float]
  batch: Any = None
  final: bool = False
  stop_requested: Callable[[], bool] | None = None

  @functools.cached_property
  def stopping(self) -> bool:
    return self.stop_requested is not None and bool(self.stop_requested())

  @property
  def last(self) -> bool:
    """The run's last step: the end of its schedule or a stop request."""
    return self.stopping or self.final


@dataclasses.dataclass(frozen=True)
class Hook:
  """Runs `fn(info)` after steps n with n % every == offset % every (every 0: never on schedule), and after
  the last step when `at_last`."""
  name: str
  fn: Callable[[StepInfo], None]
  every: int = 1
  offset: int = 0
  at_last: bool = False

  def due(self, info: StepInfo) -> bool:
    scheduled = self.every > 0 and info.step % self.every == self.offset % self.every
    return scheduled or (self.at_last and info.last)


class Hooks:
  """An ordered list of hooks."""

  def __init__(self):
    self._hooks: list[Hook] = []

  def add(self, name: str, fn: Callable[[StepInfo], None], *, every: int = 1, offset: int = 0,
          at_last: bool = False) -> None:
    if every < 0:
      raise ValueError(f"hook {name!r}: every must be >= 0, got {every}")
    self._hooks.append(Hook(name, fn, every, offset, at_last))

  @property
  def names(self) -> list[str]:
    return [h.name for h in self._hooks]

  def run(self, info: StepInfo, names: Sequence[str] | None = None) -> None:
    """Runs the hooks due after `info.step`; with `names`, runs those hooks now whatever their schedule."""
    for hook in self._hooks:
      if (hook.due(info) if names is None else hook.name in names):
        hook.fn(info)


def accuracy_text(result: dict[str, Any]) -> str:
  return " ".join(f"{k}={v:.3f}" for k, v in curves.accuracies(result).items())


def heldout_hook(workdir: pathlib.Path, evaluate: Callable[[Any], dict[str, Any]], echo: Callable[[str], None],
                 latest: dict[str, Any]) -> Callable[[StepInfo], None]:
  """Evaluates `evaluate(params)` on the held-out tasks, appends the point to the accuracy-against-cost
  curve, adds `heldout/Acc@k` to the step's metrics and keeps the result in `latest` ({"step", "result"})."""

  def run(info: StepInfo) -> None:
    cost = curves.costs_of(info.metrics)
    result = evaluate(info.state.params)
    curves.append_point(workdir, info.step, cost, result)
    echo(f"held-out after {info.step} steps {accuracy_text(result)} (cost so far: "
         f"{cost['cumulative/seconds']:.0f} s, {cost['cumulative/generated_tokens']:.0f} tokens, "
         f"{cost['cumulative/evaluator_calls']:.0f} evaluator calls)")
    info.metrics.update({f"heldout/{k}": v for k, v in curves.accuracies(result).items()})
    latest.update(step=info.step, result=result)

  return run


def episode_records(batch: RolloutBatch, chat: ChatFormat, limit: int) -> list[dict[str, Any]]:
  """JSON records of the first `limit` episodes: per turn the reply, extracted code and verdict."""
  P, G, T = batch.generated.shape
  records = []
  for e in range(min(limit, P * G)):
    p, g = divmod(e, G)
    turns = []
    for t in range(T):
      if batch.status[p, g, t] < 0:
        continue
      reply = _reply(batch, chat, e, t) if batch.generated[p, g, t] else ""
      result = batch.results.get((p, g, t))
      turns.append({"turn": t + 1, "status": STATUS_NAMES[batch.status[p, g, t]], "reply": reply,
                    "code": batch.codes.get((p, g, t)), "feedback": result.feedback if result is not None else ""})
    records.append({"task_id": batch.task_ids[p], "group": p, "sample": g, "valid": bool(batch.valid[p, g]),
                    "turns": turns})
  return records


def _reply(batch: RolloutBatch, chat: ChatFormat, episode: int, turn: int) -> str:
  """The decoded reply of rollout turn `turn`: from the token record that covers it (records start at
  `first_turns` and count their own turns from 0)."""
  for segment, first in zip(batch.segments[episode], batch.first_turns[episode]):
    if first <= turn < first + segment.num_turns:
      return chat.decode(segment.completion(turn - first), skip_special_tokens=True)
  return ""

