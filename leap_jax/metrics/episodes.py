"""Episode dumps for inspection: `<workdir>/episodes/step_<n>.jsonl`, one episode (all its turns) a line."""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional, Sequence

EPISODES_DIR = "episodes"


def _check_episode(i: int, episode: Mapping[str, Any]) -> None:
  turns = episode.get("turns") if isinstance(episode, Mapping) else None
  if not isinstance(turns, Sequence) or isinstance(turns, (str, bytes)):
    raise ValueError(f"episode {i} needs a 'turns' list, got {type(turns).__name__}")
  for t, turn in enumerate(turns):
    missing = {"code", "feedback"} - set(turn)
    if missing:
      raise ValueError(f"episode {i} turn {t} lacks {sorted(missing)}")


class EpisodeDumper:
  """Writes up to `max_episodes` episodes every `every` steps.

  An episode is a JSON-able dict with a "turns" list; each turn has at least "code" (the extracted
  kernel source) and "feedback" (the evaluator's message), e.g.
    {"task_id": "relu", "group": 3, "sample": 1, "reward": 0.71,
     "turns": [{"turn": 1, "status": "compile_error", "code": "...", "feedback": "..."}, ...]}
  """

  def __init__(self, workdir: str | os.PathLike, *, every: int, max_episodes: int, enabled: bool = True):
    if every < 1 or max_episodes < 1:
      raise ValueError(f"episode dumps need every >= 1 and max_episodes >= 1, got {every} and {max_episodes}")
    self.directory = os.path.join(os.fspath(workdir), EPISODES_DIR)
    self.every = every
    self.max_episodes = max_episodes
    self.enabled = enabled

  def due(self, step: int) -> bool:
    """Whether `maybe_dump` writes at `step` (callers can skip building the episodes otherwise)."""
    return self.enabled and step % self.every == 0

  def maybe_dump(self, step: int, episodes: Sequence[Mapping[str, Any]]) -> Optional[str]:
    """Writes the first `max_episodes` episodes when `due(step)`; returns the file path or None."""
    if not self.due(step):
      return None
    chosen = list(episodes)[:self.max_episodes]
    for i, episode in enumerate(chosen):
      _check_episode(i, episode)
    os.makedirs(self.directory, exist_ok=True)
    path = os.path.join(self.directory, f"step_{int(step):07d}.jsonl")
    with open(path, "w") as f:
      for episode in chosen:
        f.write(json.dumps({"step": int(step), **episode}, ensure_ascii=False) + "\n")
    return path


def read_episodes(path: str | os.PathLike) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]
