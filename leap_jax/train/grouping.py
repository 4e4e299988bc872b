"""TrainBatch rows -> units of rows that share a prompt, the learner's shared-prefix layout (host, numpy).

A unit is up to R rows of one group (TrainBatch.group_ids). Its prefix is the rows' longest common prefix of
untrained tokens (`leap_jax.sampling.shared_prefix.split_shared_prefix`); each row's suffix runs from there to
its last trained token. The learner runs a unit's prefix once and its R suffixes against the prefix's keys
and values (`grouped_sequence_logprobs`): the same log-probs and gradients as the rows one by one, for

  U * (Lp + R * Ls)   token positions instead of   B * L.

Rows without a trained token (padding rows, dropped turns) are left out: they add nothing to the loss. Groups
are cut into units of R rows, R as large as still gives `unit_multiple` units (each minibatch and microbatch
needs whole units). Every dimension is drawn from `batch.bucket`'s ladder (U then rounded to `unit_multiple`),
so a run compiles few distinct steps.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import flax.struct
import jax
import numpy as np

from leap_jax.sampling.shared_prefix import PrefixSplit, split_shared_prefix
from leap_jax.train.batch import TrainBatch, bucket, round_up

LENGTH_FLOOR = 16  # Lp and Ls are on the ladder 16, 32, 48, 64, 96, 128, 192, ...

Shape = tuple[int, int, int, int]  # (U, R, Lp, Ls)


@flax.struct.dataclass
class GroupedBatch:
  """U units of up to R rows sharing a prefix (host arrays, or global arrays sharded over units).

  prefix_tokens: int32[U, Lp] each unit's shared prefix, right-padded.
  prefix_len: int32[U] its length (0 for padding units).
  tokens: int32[U, R, Ls] each row's suffix (the tokens after the prefix), right-padded.
  policy_mask, advantages, old_logprobs, ref_logprobs: as in TrainBatch, on the suffix tokens [U, R, Ls]
    (a prefix holds no trained token).
  """
  prefix_tokens: jax.Array
  prefix_len: jax.Array
  tokens: jax.Array
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


def ladder_shape(split: Optional[PrefixSplit], unit_multiple: int = 1) -> Shape:
  """(U, R, Lp, Ls) of `split` raised to `batch.bucket`'s ladder, U also to a multiple of `unit_multiple`
  (a batch without rows: the smallest shape)."""
  need = (1, 1, 1, 1) if split is None else (split.num_groups, split.group_size, split.prefix_width,
                                              split.suffix_width)
  return (round_up(bucket(need[0]), unit_multiple), bucket(need[1]), bucket(need[2], LENGTH_FLOOR),
          bucket(need[3], LENGTH_FLOOR))


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
  tokens = np.asarray(batch.tokens)[rows]
  split = None
  if rows.size:
    split = split_shared_prefix(tokens, unit_ids(np.asarray(batch.group_ids)[rows], unit_multiple),
                                policy[rows], multiple=1)
  shape = ladder_shape(split, unit_multiple)
  if agree is not None:
    shape = agree(shape)
  out = _gather(batch, rows, split, shape)
  used = 0 if split is None else int(split.prefix_len.sum()) + _suffix_tokens(policy[rows], split)
  U, R, Lp, Ls = shape
  positions = U * (Lp + R * Ls)
  return out, LayoutStats(positions, positions - used, int(np.prod(batch.tokens.shape)))


def _suffix_tokens(policy: np.ndarray, split) -> int:
  """Positions the rows' suffixes need: from their unit's prefix end to their last trained token."""
  ends = policy.shape[1] - np.argmax(policy[:, ::-1], axis=1)
  return int(np.sum(ends - split.prefix_len[split.row_group]))


def _gather(batch: TrainBatch, rows: np.ndarray, split, shape: Shape) -> GroupedBatch:
  """Host copy of the kept rows into the [U, Lp] / [U, R, Ls] arrays of `shape`."""
  U, R, Lp, Ls = shape
  prefix_tokens = np.zeros((U, Lp), np.int32)
  prefix_len = np.zeros(U, np.int32)
  per_token = {"tokens": np.int32, "policy_mask": bool, "advantages": np.float32, "old_logprobs": np.float32}
  if batch.ref_logprobs is not None:
    per_token["ref_logprobs"] = np.float32
  out = {name: np.zeros((U, R, Ls), dtype) for name, dtype in per_token.items()}
  source = {name: np.asarray(getattr(batch, name))[rows] for name in out}
  if split is not None:
    prefix_len[:split.num_groups] = split.prefix_len
    for i in range(len(rows)):
      n, g = split.row_group[i], split.row_slot[i]
      start = int(split.prefix_len[n])
      if g == 0:
        prefix_tokens[n, :start] = source["tokens"][i, :start]
      for name in out:
        piece = source[name][i, start:start + Ls]
        out[name][n, g, :len(piece)] = piece
  return GroupedBatch(prefix_tokens=prefix_tokens, prefix_len=prefix_len, **out)
