"""Deterministic, resumable task order: one seeded permutation of the pool per epoch."""
from __future__ import annotations

import dataclasses
from typing import Any, Generic, Sequence, TypeVar

import numpy as np

T = TypeVar("T")


@dataclasses.dataclass
class TaskPool(Generic[T]):
  """Draws tasks without replacement within an epoch, reshuffling at each epoch boundary.

  The order is a pure function of (seed, epoch), so a run restored from `state_dict()` draws
  exactly the tasks an uninterrupted run would have drawn.

  Attributes:
    tasks: the pool (any objects; kept in the given order before shuffling).
    seed: run seed.
    epoch: epochs completed so far.
    cursor: position inside the current epoch's permutation.
  """
  tasks: Sequence[T]
  seed: int
  epoch: int = 0
  cursor: int = 0

  def __post_init__(self):
    if not self.tasks:
      raise ValueError("TaskPool: the task pool is empty (check the task levels and split in the config)")

  def _order(self, epoch: int) -> np.ndarray:
    return np.random.default_rng([self.seed, epoch]).permutation(len(self.tasks))

  def draw(self, n: int) -> list[T]:
    """Returns the next `n` tasks; an epoch boundary inside a draw continues into the next epoch."""
    if n <= 0:
      raise ValueError(f"TaskPool.draw: n must be positive, got {n}")
    out = []
    while len(out) < n:
      order = self._order(self.epoch)
      take = min(n - len(out), len(order) - self.cursor)
      out.extend(self.tasks[i] for i in order[self.cursor:self.cursor + take])
      self.cursor += take
      if self.cursor == len(order):
        self.epoch, self.cursor = self.epoch + 1, 0
    return out

  def state_dict(self) -> dict[str, Any]:
    return {"seed": self.seed, "epoch": self.epoch, "cursor": self.cursor, "size": len(self.tasks)}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    if state["seed"] != self.seed or state["size"] != len(self.tasks):
      raise ValueError(f"TaskPool.load_state_dict: saved pool (seed={state['seed']}, size={state['size']}) "
                       f"does not match this pool (seed={self.seed}, size={len(self.tasks)})")
    self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
