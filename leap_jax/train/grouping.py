"""TrainBatch rows -> units of rows that share a prompt, the learner's shared-prefix layout (host, numpy).

A unit is rows of one group (TrainBatch.group_ids). Its prefix is the rows' longest common prefix of
untrained tokens (`leap_jax.sampling.shared_prefix.split_shared_prefix`); each row's suffix runs from there to
its last trained token. Suffixes are packed into R slots of Ls positions (Ls: the longest suffix): first fit,
longest first, so a 3-turn episode's suffix and a few 1-turn ones share a slot's width instead of each
padding to it. The learner runs a unit's prefix once and its slots against the prefix's keys and values, each
suffix attending to its own tokens only (`grouped_sequence_logprobs` with each token's episode as its segment):
the same log-probs and gradients as the rows one by one, for

  U * (Lp + R * Ls)   token positions instead of   B * L.

Rows without a trained token (padding rows, dropped turns) are left out: they add nothing to the loss. Groups
are cut into units of equal row counts, as large as still gives `unit_multiple` units (each minibatch and
microbatch needs whole units). Every dimension is drawn from `buckets.bucket`'s ladder (U then rounded to
`unit_multiple`), so a run compiles few distinct steps.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import flax.struct
import jax
import numpy as np

from leap_jax.sampling.buckets import bucket
from leap_jax.sampling.shared_prefix import split_shared_prefix
from leap_jax.train.batch import TrainBatch, round_up

LENGTH_FLOOR = 16  # Lp and Ls are on the ladder 16, 32, 48, 64, 96, 128, 192, ...

Shape = tuple[int, int, int, int]  # (U, R, Lp, Ls)


@flax.struct.dataclass
class GroupedBatch:
  """U units of up to R rows sharing a prefix (host arrays, or global arrays sharded over units).

  prefix_tokens: int32[U, Lp] each unit's shared prefix, right-padded.
  prefix_len: int32[U] its length (0 for padding units).
  tokens: int32[U, R, Ls] the rows' suffixes (the tokens after the prefix), packed into slots, right-padded.
  episodes: int32[U, R, Ls] the suffix each token belongs to, named by where it starts in its unit, s * Ls + c
    for slot s and column c (-1 for padding): the segment ids of a slot's attention and, offset by the unit,
    the episodes of the loss's aggregation.
  offsets: int32[U, R, Ls] each token's position after the prefix (0 starts a suffix).
  policy_mask, advantages, old_logprobs, ref_logprobs: as in TrainBatch, on the suffix tokens [U, R, Ls]
    (a prefix holds no trained token).
  """
  prefix_tokens: jax.Array
  prefix_len: jax.Array
  tokens: jax.Array
  episodes: jax.Array
  offsets: jax.Array
  policy_mask: jax.Array
  advantages: jax.Array
  old_logprobs: jax.Array
  ref_logprobs: Optional[jax.Array] = None


@dataclasses.dataclass(frozen=True)
class LayoutStats:
  """Token positions of one forward pass over a batch, in the layout the learner runs and row by row.

  positions: positions the model runs (B * L rows; U * (Lp + R * Ls) grouped).
  padding: of those, positions that hold no token the loss needs.
  row_positions: B * L, the per-episode layout of the same batch.
  """
  positions: int
  padding: int
  row_positions: int

  @classmethod
  def of_rows(cls, batch: TrainBatch) -> "LayoutStats":
    size = int(np.prod(batch.tokens.shape))
    return cls(size, size - int(np.asarray(batch.input_mask).sum()), size)

  def metrics(self) -> dict[str, float]:
    return {"learner/positions": float(self.positions),
            "learner/padding_share": self.padding / max(self.positions, 1),
            "learner/positions_saved": 1.0 - self.positions / max(self.row_positions, 1)}


def ladder_shape(need: Shape, unit_multiple: int = 1) -> Shape:
  """(U, R, Lp, Ls) raised to `buckets.bucket`'s ladder, U also to a multiple of `unit_multiple`."""
  return (round_up(bucket(need[0]), unit_multiple), bucket(need[1]), bucket(need[2], LENGTH_FLOOR),
          bucket(need[3], LENGTH_FLOOR))


def pack_slots(unit: np.ndarray, lengths: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, int]:
  """First fit, longest first, of each unit's suffixes into slots of `width` positions.

  Args:
    unit: int[n] each suffix's unit; lengths: int[n] its length (<= width).

  Returns:
    (slot int[n], column int[n] where the suffix starts in its slot, the most slots a unit needs).
  """
  slot, column = np.zeros(len(unit), np.int64), np.zeros(len(unit), np.int64)
  most = 1
  for u in np.unique(unit):
    members = np.flatnonzero(unit == u)
    used: list[int] = []
    for i in members[np.argsort(-lengths[members], kind="stable")]:
      s = next((k for k, n in enumerate(used) if n + lengths[i] <= width), len(used))
      if s == len(used):
        used.append(0)
      slot[i], column[i] = s, used[s]
      used[s] += int(lengths[i])
    most = max(most, len(used))
  return slot, column, most


def unit_ids(group_ids: np.ndarray, unit_multiple: int) -> np.ndarray:
  """int[B] unit of each row: its group cut into chunks of R rows (in row order), with R the largest size that
  still gives at least `unit_multiple` units (or R = 1 when the rows are fewer)."""
  _, inverse, counts = np.unique(group_ids, return_inverse=True, return_counts=True)
  rows_per_unit = int(counts.max())
  while rows_per_unit > 1 and np.sum(-(-counts // rows_per_unit)) < unit_multiple:
    rows_per_unit -= 1
  rank = np.zeros(len(group_ids), np.int64)
  for g in range(len(counts)):
    members = np.flatnonzero(inverse == g)
    rank[members] = np.arange(len(members))
  return inverse.astype(np.int64) * len(group_ids) + rank // rows_per_unit


def group_batch(batch: TrainBatch, unit_multiple: int = 1,
                agree: Optional[Callable[[Shape], Shape]] = None) -> tuple[GroupedBatch, LayoutStats]:
  """The shared-prefix layout of a host TrainBatch with group_ids.

  Args:
    batch: host arrays [B, L] with `group_ids`.
    unit_multiple: U is padded with empty units to a multiple of this (minibatches x microbatches x shards).
    agree: maps this batch's shape (U, R, Lp, Ls) to the one to use, e.g. the largest over processes.
  """
  if batch.group_ids is None:
    raise ValueError("the shared-prefix layout needs TrainBatch.group_ids")
  policy = np.asarray(batch.policy_mask)
  rows = np.flatnonzero(policy.any(1) & (np.asarray(batch.group_ids) >= 0))
  if not rows.size:
    shape = ladder_shape((1, 1, 1, 1), unit_multiple)
    shape = agree(shape) if agree is not None else shape
    return _gather(batch, rows, None, shape), _stats(shape, 0, batch)
  policy = policy[rows]
  split = split_shared_prefix(np.asarray(batch.tokens)[rows], unit_ids(np.asarray(batch.group_ids)[rows],
                                                                         unit_multiple), policy, multiple=1)
  ends = policy.shape[1] - np.argmax(policy[:, ::-1], axis=1)  # last trained token + 1
  lengths = ends - split.prefix_len[split.row_group]
  width = bucket(int(lengths.max()), LENGTH_FLOOR)
  slot, column, slots = pack_slots(split.row_group, lengths, width)
  shape = ladder_shape((split.num_groups, slots, split.prefix_width, width), unit_multiple)
  shape = agree(shape) if agree is not None else shape
  out = _gather(batch, rows, (split, lengths, slot, column), shape)
  return out, _stats(shape, int(split.prefix_len.sum() + lengths.sum()), batch)


def _stats(shape: Shape, used: int, batch: TrainBatch) -> LayoutStats:
  U, R, Lp, Ls = shape
  positions = U * (Lp + R * Ls)
  return LayoutStats(positions, positions - used, int(np.prod(batch.tokens.shape)))


def _gather(batch: TrainBatch, rows: np.ndarray, placement, shape: Shape) -> GroupedBatch:
  """Host copy of the kept rows into the [U, Lp] / [U, R, Ls] arrays of `shape`; placement: None (no rows)
  or (split, suffix lengths, slot, column) of each kept row."""
  U, R, Lp, Ls = shape
  prefix_tokens = np.zeros((U, Lp), np.int32)
  prefix_len = np.zeros(U, np.int32)
  per_token = {"tokens": np.int32, "policy_mask": bool, "advantages": np.float32, "old_logprobs": np.float32}
  if batch.ref_logprobs is not None:
    per_token["ref_logprobs"] = np.float32
  out = {name: np.zeros((U, R, Ls), dtype) for name, dtype in per_token.items()}
  episodes = np.full((U, R, Ls), -1, np.int32)
  offsets = np.zeros((U, R, Ls), np.int32)
  if placement is not None:
    split, lengths, slot, column = placement
    source = {name: np.asarray(getattr(batch, name))[rows] for name in out}
    prefix_len[:split.num_groups] = split.prefix_len
    for i in range(len(rows)):
      n, s, c, k = split.row_group[i], slot[i], column[i], int(lengths[i])
      start = int(split.prefix_len[n])
      prefix_tokens[n, :start] = source["tokens"][i, :start]
      for name in out:
        out[name][n, s, c:c + k] = source[name][i, start:start + k]
      episodes[n, s, c:c + k] = s * Ls + c
      offsets[n, s, c:c + k] = np.arange(k)
  return GroupedBatch(prefix_tokens=prefix_tokens, prefix_len=prefix_len, episodes=episodes, offsets=offsets,
                      **out)
