"""One multi-turn episode as the exact token ids the policy saw and produced, and its learner arrays.

Token t of an episode carries: its id, its turn (0-based), whether the policy sampled it (trained) or it came
from the prompt / feedback (not trained), and, for sampled tokens, the sampler's log-prob
log softmax(logits / temperature)[token] given tokens < t (0 elsewhere).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from leap_jax.sampling.sampler import FINISH_REASONS


@dataclasses.dataclass
class Episode:
  """Growing token record of one episode; turns are appended, history is never re-tokenised.

  Attributes:
    tokens: ids of every token, all turns concatenated.
    turns: turn index of each token (0 for the first prompt and completion).
    policy: True where the policy sampled the token.
    logprobs: sampler log-prob of each policy token, 0.0 for prompt / feedback tokens.
    finish_reasons: one per completed turn, from FINISH_REASONS.
  """
  tokens: list[int] = dataclasses.field(default_factory=list)
  turns: list[int] = dataclasses.field(default_factory=list)
  policy: list[bool] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  finish_reasons: list[str] = dataclasses.field(default_factory=list)

  def __len__(self) -> int:
    return len(self.tokens)

  @property
  def num_turns(self) -> int:
    """Turns begun so far (a turn begins with its prompt)."""
    return self.turns[-1] + 1 if self.turns else 0

  @property
  def awaiting_completion(self) -> bool:
    """True when the last turn has its prompt but no completion yet."""
    return self.num_turns > len(self.finish_reasons)

  def add_prompt(self, ids: Sequence[int]) -> None:
    """Starts a new turn with prompt / feedback ids (not trained)."""
    if self.awaiting_completion:
      raise ValueError(f"turn {self.num_turns - 1} has a prompt but no completion yet")
    ids = _as_ids("prompt", ids)
    if not ids:
      raise ValueError("a turn's prompt must have at least one token")
    turn = self.num_turns
    self.tokens += ids
    self.turns += [turn] * len(ids)
    self.policy += [False] * len(ids)
    self.logprobs += [0.0] * len(ids)

  def add_completion(self, ids: Sequence[int], logprobs: Sequence[float], finish_reason: str) -> None:
    """Ends the current turn with the sampled ids and their sampler log-probs."""
    if not self.awaiting_completion:
      raise ValueError("add_prompt must come before add_completion")
    ids = _as_ids("completion", ids)
    logprobs = [float(x) for x in logprobs]
    if len(logprobs) != len(ids):
      raise ValueError(f"{len(ids)} completion ids but {len(logprobs)} log-probs")
    if finish_reason not in FINISH_REASONS:
      raise ValueError(f"finish_reason {finish_reason!r} is not one of {FINISH_REASONS}")
    turn = self.num_turns - 1
    self.tokens += ids
    self.turns += [turn] * len(ids)
    self.policy += [True] * len(ids)
    self.logprobs += logprobs
    self.finish_reasons.append(finish_reason)

  def completion(self, turn: int) -> list[int]:
    """The ids the policy generated in `turn`."""
    return [t for t, k, p in zip(self.tokens, self.turns, self.policy) if k == turn and p]

  def prompt(self, turn: int) -> list[int]:
    """The prompt / feedback ids that opened `turn`."""
    return [t for t, k, p in zip(self.tokens, self.turns, self.policy) if k == turn and not p]


def stack_episodes(episodes: Sequence[Episode], length: int | None = None, pad_id: int = 0
                   ) -> dict[str, np.ndarray]:
  """Right-pads episodes into learner arrays.

  Args:
    episodes: E episodes.
    length: L, default the longest episode; an episode longer than L raises.
    pad_id: id written past each episode's end.

  Returns:
    dict with tokens int32[E, L], input_mask bool[E, L] (real tokens), policy_mask bool[E, L],
    sampler_logprobs f32[E, L] (0 off-policy), turns int32[E, L] (-1 on padding), lengths int32[E].
  """
  if not episodes:
    raise ValueError("stack_episodes needs at least one episode")
  longest = max(len(e) for e in episodes)
  length = longest if length is None else length
  if longest > length:
    raise ValueError(f"an episode has {longest} tokens, more than length={length}")
  E = len(episodes)
  out = {"tokens": np.full((E, length), pad_id, np.int32), "input_mask": np.zeros((E, length), bool),
         "policy_mask": np.zeros((E, length), bool), "sampler_logprobs": np.zeros((E, length), np.float32),
         "turns": np.full((E, length), -1, np.int32),
         "lengths": np.array([len(e) for e in episodes], np.int32)}
  for i, e in enumerate(episodes):
    n = len(e)
    out["tokens"][i, :n] = e.tokens
    out["input_mask"][i, :n] = True
    out["policy_mask"][i, :n] = e.policy
    out["sampler_logprobs"][i, :n] = e.logprobs
    out["turns"][i, :n] = e.turns
  return out


def _as_ids(name: str, ids: Sequence[int]) -> list[int]:
  out = [int(i) for i in ids]
  if any(i < 0 for i in out):
    raise ValueError(f"{name} ids must be non-negative, got {min(out)}")
  return out
