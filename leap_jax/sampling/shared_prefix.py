"""Learner log-probs with each group's shared prompt encoded once (Prefix Grouper, arXiv 2506.05433).

In GRPO-style RL, the G episodes of a group start with the same prompt (system message + task). The per-episode
path (`sequence_logprobs`) runs forward and backward over that prompt G times. Here every group's prefix
x_{<Lp_n} runs through the model once; each episode's suffix then attends to the prefix's keys/values plus its
own causal context, so for suffix token j of episode g of group n (true position t = Lp_n + j):

  logp_{n,g,j} = log softmax(z(x_{n,<Lp_n} ++ y_{n,g,<j}) / tau)[y_{n,g,j}]

which is exactly `sequence_logprobs` of the row prefix ++ suffix at position t: RoPE uses the true positions,
suffix queries never see prefix padding, and the first suffix token is predicted from the prefix's last
hidden state. The prefix's keys/values are shared by the G suffix rows through an einsum batch dimension
(`Transformer(prefix_kv=...)`), never copied; reverse-mode AD sums the G suffixes' cotangents into the one
prefix pass, so parameter gradients equal the per-episode ones.

Two layers:
  * `grouped_sequence_logprobs`: the jit-friendly core on explicit [N, Lp] prefixes and [N, G, Ls] suffixes.
  * `split_shared_prefix` (host, numpy) + `shared_prefix_logprobs`: a drop-in for `sequence_logprobs` on
    [B, L] rows with a group id per row; returns f32[B, L] equal to `sequence_logprobs` (values and gradients).
"""
from __future__ import annotations

from typing import Optional, Union

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from leap_jax.sampling.logprobs import token_logprobs


def _chunked_logprobs(model, before: jax.Array, tokens: jax.Array, temperature: float,
                      chunk_size: Optional[int]) -> jax.Array:
  """log softmax(output(before[b, t]) / tau)[tokens[b, t]]: [B, L, D], int[B, L] -> f32[B, L].

  As in `sequence_logprobs`: the output layer runs over chunks of positions inside a rematerialised scan, so
  no more than one [B, chunk_size, V] block of logits is live in the forward or backward pass.
  """
  B, L, D = before.shape
  C = L if chunk_size is None else min(chunk_size, L)
  n = -(-L // C)
  pad = n * C - L
  h = jnp.pad(before, ((0, 0), (0, pad), (0, 0))).reshape(B, n, C, D).swapaxes(0, 1)  # [n, B, C, D]
  x = jnp.pad(tokens, ((0, 0), (0, pad))).reshape(B, n, C).swapaxes(0, 1)  # [n, B, C]
  body = jax.checkpoint(lambda h, x: token_logprobs(model.logits_from_hidden(h), x, temperature))
  _, out = jax.lax.scan(lambda carry, hx: (carry, body(*hx)), None, (h, x))
  return out.swapaxes(0, 1).reshape(B, n * C)[:, :L]


def _check_grouped(prefix_tokens, prefix_len, suffix_tokens, suffix_mask, prefix_mask, chunk_size) -> None:
  """Raises ValueError naming the first argument of `grouped_sequence_logprobs` with a wrong shape."""
  if prefix_tokens.ndim != 2 or prefix_len.shape != prefix_tokens.shape[:1]:
    raise ValueError(f"prefix_tokens must be [N, Lp] and prefix_len [N], got {prefix_tokens.shape} and "
                     f"{prefix_len.shape}")
  N, Lp = prefix_tokens.shape
  if suffix_tokens.ndim != 3 or suffix_tokens.shape[0] != N or suffix_mask.shape != suffix_tokens.shape:
    raise ValueError(f"suffix_tokens and suffix_mask must both be [N={N}, G, Ls], got {suffix_tokens.shape} "
                     f"and {suffix_mask.shape}")
  if prefix_mask is not None and prefix_mask.shape != (N, Lp):
    raise ValueError(f"prefix_mask must be [N={N}, Lp={Lp}], got {prefix_mask.shape}")
  if chunk_size is not None and chunk_size <= 0:
    raise ValueError(f"chunk_size must be positive or None, got {chunk_size}")


def grouped_sequence_logprobs(graphdef: nnx.GraphDef, params: nnx.State, prefix_tokens: jax.Array,
                              prefix_len: jax.Array, suffix_tokens: jax.Array, suffix_mask: jax.Array, *,
                              prefix_mask: Optional[jax.Array] = None, temperature: float = 1.0,
                              chunk_size: Optional[int] = 256, suffix_segments: Optional[jax.Array] = None,
                              suffix_offsets: Optional[jax.Array] = None) -> tuple[Optional[jax.Array], jax.Array]:
  """Per-token log-probs of N groups of G sequences sharing a prefix per group; differentiable in `params`.

  Group n's g-th sequence is prefix_tokens[n, :prefix_len[n]] ++ suffix_tokens[n, g]; suffix token j sits at
  position prefix_len[n] + j. With tau the temperature and z the logits:

    suffix_logprobs[n, g, j] = log softmax(z(prefix_n ++ suffix_{n,g,<j}) / tau)[suffix_tokens[n, g, j]]
    prefix_logprobs[n, t]    = log softmax(z(prefix_n[<t]) / tau)[prefix_tokens[n, t]]

  i.e. `sequence_logprobs` of the concatenated row (token at position 0 has no log-prob: 0). Cost: one
  forward/backward over the N * Lp prefix tokens plus N * G * Ls suffix tokens, instead of N * G * (Lp + Ls).

  Packed slots: with `suffix_segments` and `suffix_offsets`, slot (n, g) holds several suffixes one after
  another; token j belongs to suffix suffix_segments[n, g, j] and sits at position prefix_len[n] +
  suffix_offsets[n, g, j] (offset 0 starts a suffix). It attends to the prefix and to its own suffix only, so
  each suffix gets the log-probs it would get alone in a slot, and short suffixes share a slot's width.

  Args:
    graphdef, params: the model, as from `nnx.split(model)` (any scan_layers / remat / GQA / bias config).
    prefix_tokens: int32[N, Lp] right-padded prefixes (entries past prefix_len[n] are ignored).
    prefix_len: int32[N] true prefix lengths, 0 <= prefix_len[n] <= Lp.
    suffix_tokens: int32[N, G, Ls] right-padded suffixes (the tokens after the prefix).
    suffix_mask: bool[N, G, Ls] where to report suffix log-probs (padding must be False).
    prefix_mask: bool[N, Lp] where to report prefix log-probs, or None to skip them (saves the prefix's
      output-layer work when no prefix token is trained).
    temperature: tau (0, greedy, counts as 1).
    chunk_size: positions per output-layer chunk; None: all at once.
    suffix_segments, suffix_offsets: int32[N, G, Ls] each, or None (one suffix per slot, offsets 0..Ls-1).

  Returns:
    (prefix_logprobs f32[N, Lp] or None, suffix_logprobs f32[N, G, Ls]), 0 where not reported.
  """
  _check_grouped(prefix_tokens, prefix_len, suffix_tokens, suffix_mask, prefix_mask, chunk_size)
  N, Lp = prefix_tokens.shape
  _, G, Ls = suffix_tokens.shape
  model = nnx.merge(graphdef, params)
  prefix_len = prefix_len.astype(jnp.int32)

  # 1. The prefixes, once per group: final hidden states and every layer's keys/values.
  t = jnp.arange(Lp, dtype=jnp.int32)
  pre = model(prefix_tokens.astype(jnp.int32), jnp.broadcast_to(t, (N, Lp)), return_logits=False, return_kv=True)
  valid = t[None, :] < prefix_len[:, None]  # [N, Lp]

  # 2. The N * G slots at their true positions, attending to their group's valid prefix keys.
  if (suffix_segments is None) != (suffix_offsets is None):
    raise ValueError("suffix_segments and suffix_offsets come together")
  packed = suffix_segments is not None
  if packed and not suffix_segments.shape == suffix_offsets.shape == suffix_tokens.shape:
    raise ValueError(f"suffix_segments and suffix_offsets must be [N, G, Ls] = {suffix_tokens.shape}, got "
                     f"{suffix_segments.shape} and {suffix_offsets.shape}")
  offsets = (suffix_offsets.astype(jnp.int32) if packed
             else jnp.broadcast_to(jnp.arange(Ls, dtype=jnp.int32), (N, G, Ls)))
  suffix_pos = prefix_len[:, None, None] + offsets
  suf = model(suffix_tokens.reshape(N * G, Ls).astype(jnp.int32), suffix_pos.reshape(N * G, Ls),
              return_logits=False, prefix_kv=pre.cache, prefix_valid=valid,
              segment_ids=suffix_segments.reshape(N * G, Ls).astype(jnp.int32) if packed else None)
  hidden = suf.final_hidden.reshape(N, G, Ls, -1)

  # 3. A suffix token is predicted from the state before it: the prefix's last state at offset 0.
  last = jnp.take_along_axis(pre.final_hidden, jnp.maximum(prefix_len - 1, 0)[:, None, None], axis=1)
  shifted = jnp.concatenate([jnp.zeros_like(hidden[:, :, :1]), hidden[:, :, :-1]], axis=2)
  before = jnp.where((offsets == 0)[..., None], last[:, None], shifted).reshape(N * G, Ls, -1)
  suffix_lp = _chunked_logprobs(model, before, suffix_tokens.reshape(N * G, Ls).astype(jnp.int32),
                                temperature, chunk_size).reshape(N, G, Ls)
  suffix_lp = jnp.where(suffix_mask.astype(bool) & (suffix_pos > 0), suffix_lp, 0.0)

  prefix_lp = None
  if prefix_mask is not None:
    before = jnp.concatenate([jnp.zeros_like(pre.final_hidden[:, :1]), pre.final_hidden[:, :-1]], axis=1)
    prefix_lp = _chunked_logprobs(model, before, prefix_tokens.astype(jnp.int32), temperature, chunk_size)
    prefix_lp = jnp.where(prefix_mask.astype(bool) & valid & (t > 0)[None, :], prefix_lp, 0.0)
  return prefix_lp, suffix_lp


@flax.struct.dataclass
class PrefixSplit:
  """Host-computed layout of [B, L] rows as N groups of (shared prefix, G suffixes); a pytree for `jax.jit`.

  Row b belongs to group row_group[b], suffix slot row_slot[b]; its tokens [0, prefix_len[n]) are the
  group's prefix (identical in all its rows, none of them trained), the rest its suffix. The array shapes
  and the two static widths fix the compiled shapes; the values may change from batch to batch.

  row_group: int32[B] group n of each row.
  row_slot: int32[B] suffix slot g of each row within its group.
  group_rows: int32[N, G] row of each slot, -1 for the empty slots of groups smaller than G (slot 0 is
    always a row; padding groups added by `group_multiple` point at row 0 and have prefix_len 0).
  prefix_len: int32[N] shared prefix length per group.
  prefix_width: Lp >= max(prefix_len) (static).
  suffix_width: Ls (static): every row's reported positions t satisfy t < prefix_len + Ls.
  prefix_reported: (static) whether some reported position (t > 0) lies inside a shared prefix, i.e. the
    prefix's own log-probs must be computed (the mask was wider than the unshareable tokens).
  """
  row_group: jax.Array
  row_slot: jax.Array
  group_rows: jax.Array
  prefix_len: jax.Array
  prefix_width: int = flax.struct.field(pytree_node=False)
  suffix_width: int = flax.struct.field(pytree_node=False)
  prefix_reported: bool = flax.struct.field(pytree_node=False, default=True)

  @property
  def num_groups(self) -> int:
    return self.group_rows.shape[0]

  @property
  def group_size(self) -> int:
    return self.group_rows.shape[1]

  @property
  def tokens_per_pass(self) -> int:
    """Token positions the model runs on, N * (Lp + G * Ls) (the per-episode path runs B * L)."""
    return self.num_groups * (self.prefix_width + self.group_size * self.suffix_width)


def _round_up(n: int, multiple: int) -> int:
  return max(multiple, -(-n // multiple) * multiple)


def split_shared_prefix(tokens: np.ndarray, group_ids: np.ndarray, mask: np.ndarray,
                        trainable: Optional[np.ndarray] = None, *, multiple: int = 8,
                        group_multiple: int = 1) -> PrefixSplit:
  """Splits [B, L] rows into groups' longest shared prefixes and per-row suffixes (host side, numpy).

  A group's prefix is its rows' longest common prefix of tokens that no row of the group trains:
  prefix_len[n] = the first t where the rows' tokens differ or some row has trainable[b, t], capped at the
  group's last reported position + 1. A row's suffix runs from prefix_len to its last reported position
  (last True of `mask`) + 1; tokens after that cannot change any reported log-prob and are dropped. Groups
  may have different sizes (G = the largest; smaller ones get empty slots) and rows may be in any order.

  Args:
    tokens: int[B, L] right-padded rows.
    group_ids: int[B] any hashable-as-int id per row; rows with equal ids form a group.
    mask: bool[B, L] the positions whose log-probs will be asked for (`mask` of `shared_prefix_logprobs`).
    trainable: bool[B, L] tokens that must not be shared (the policy mask); default `mask`.
    multiple: Lp and Ls are rounded up to a multiple of this (fewer distinct compiled shapes).
    group_multiple: N is padded with empty groups to a multiple of this (e.g. the batch shards of a mesh).
  """
  tokens = np.asarray(tokens)
  mask = np.asarray(mask, bool)
  group_ids = np.asarray(group_ids)
  trainable = mask if trainable is None else np.asarray(trainable, bool)
  if tokens.ndim != 2 or mask.shape != tokens.shape or trainable.shape != tokens.shape:
    raise ValueError(f"tokens, mask and trainable must be [B, L], got {tokens.shape}, {mask.shape}, "
                     f"{trainable.shape}")
  if group_ids.shape != tokens.shape[:1]:
    raise ValueError(f"group_ids must be [B={tokens.shape[0]}], got {group_ids.shape}")
  if multiple < 1 or group_multiple < 1:
    raise ValueError(f"multiple and group_multiple must be >= 1, got {multiple} and {group_multiple}")
  B, L = tokens.shape
  ends = np.where(mask.any(1), L - np.argmax(mask[:, ::-1], axis=1), 0)  # last reported position + 1
  _, first_seen, inverse = np.unique(group_ids, return_index=True, return_inverse=True)
  order = np.argsort(first_seen)  # groups in order of first appearance
  rank = np.empty_like(order)
  rank[order] = np.arange(len(order))
  row_group = rank[inverse.reshape(-1)].astype(np.int32)
  n_real = len(order)
  N = _round_up(n_real, group_multiple)
  members = [np.flatnonzero(row_group == n) for n in range(n_real)]
  G = max(len(m) for m in members)
  group_rows = np.full((N, G), -1, np.int32)
  group_rows[n_real:, 0] = 0
  row_slot = np.zeros(B, np.int32)
  prefix_len = np.zeros(N, np.int32)
  for n, rows in enumerate(members):
    group_rows[n, :len(rows)] = rows
    row_slot[rows] = np.arange(len(rows))
    shareable = np.all(tokens[rows] == tokens[rows[0]], axis=0) & ~trainable[rows].any(0)
    lcp = L if shareable.all() else int(np.argmin(shareable))
    prefix_len[n] = min(lcp, int(ends[rows].max()))
  suffix_need = int(np.max(ends - prefix_len[row_group], initial=0))
  in_prefix = (np.arange(L)[None, :] < prefix_len[row_group][:, None]) & (np.arange(L) > 0)[None, :]
  return PrefixSplit(row_group=row_group, row_slot=row_slot, group_rows=group_rows, prefix_len=prefix_len,
                     prefix_width=_round_up(int(prefix_len.max()), multiple),
                     suffix_width=_round_up(suffix_need, multiple),
                     prefix_reported=bool(np.any(mask & in_prefix)))


def pad_split(split: PrefixSplit, num_groups: int, group_size: int, prefix_width: int,
              suffix_width: int) -> PrefixSplit:
  """`split` with N, G, Lp and Ls raised to the given sizes (empty groups and slots added), so that batches
  of different layouts can share one compiled shape."""
  N, G = split.group_rows.shape
  if num_groups < N or group_size < G or prefix_width < split.prefix_width or suffix_width < split.suffix_width:
    raise ValueError(f"pad_split cannot shrink [N={N}, G={G}, Lp={split.prefix_width}, Ls={split.suffix_width}] "
                     f"to [{num_groups}, {group_size}, {prefix_width}, {suffix_width}]")
  group_rows = np.full((num_groups, group_size), -1, np.int32)
  group_rows[:N, :G] = split.group_rows
  group_rows[N:, 0] = 0
  prefix_len = np.zeros(num_groups, np.int32)
  prefix_len[:N] = split.prefix_len
  return split.replace(group_rows=group_rows, prefix_len=prefix_len, prefix_width=prefix_width,
                       suffix_width=suffix_width)


def _split_rows(tokens: jax.Array, mask: jax.Array, split: PrefixSplit, report_prefix: bool):
  """[B, L] rows -> (prefix_tokens [N, Lp], suffix_tokens [N, G, Ls], suffix_mask [N, G, Ls], prefix_mask [N, Lp]
  or None): the gathers of `split`'s layout (a prefix position is reported if any row of its group asks)."""
  L = tokens.shape[1]
  Lp, Ls = split.prefix_width, split.suffix_width
  plen = jnp.asarray(split.prefix_len, jnp.int32)
  group_rows = jnp.asarray(split.group_rows, jnp.int32)
  slot_ok = group_rows >= 0  # [N, G]
  rows = jnp.maximum(group_rows, 0)

  def gather(x, r, cols, fill):
    """x[r, cols] with cols past L -> fill: r int[...] broadcasting against cols int[..., W]."""
    return jnp.where(cols < L, x[r, jnp.minimum(cols, L - 1)], fill)

  t = jnp.arange(Lp, dtype=jnp.int32)
  prefix_tokens = gather(tokens, rows[:, :1], t[None, :], 0)  # [N, Lp]
  cols = plen[:, None, None] + jnp.arange(Ls, dtype=jnp.int32)  # [N, 1, Ls]
  suffix_tokens = gather(tokens, rows[..., None], cols, 0)  # [N, G, Ls]
  suffix_mask = gather(mask, rows[..., None], cols, False) & slot_ok[..., None]
  prefix_mask = None
  if report_prefix:
    prefix_mask = (gather(mask, rows[..., None], t[None, None, :], False) & slot_ok[..., None]).any(1)
  return prefix_tokens, suffix_tokens, suffix_mask, prefix_mask


def shared_prefix_logprobs(graphdef: nnx.GraphDef, params: nnx.State, tokens: jax.Array, mask: jax.Array,
                           split: Union[PrefixSplit, np.ndarray], *, temperature: float = 1.0,
                           chunk_size: Optional[int] = 256, trainable: Optional[np.ndarray] = None,
                           prefix_logprobs: Optional[bool] = None, multiple: int = 8) -> jax.Array:
  """Drop-in for `sequence_logprobs(graphdef, params, tokens, mask)`, with each group's prefix run once.

  Returns f32[B, L]: log p(tokens[b, t] | tokens[b, :t]) where mask[b, t] and t > 0, else 0 — the same values
  (up to float rounding) and the same parameter gradients as `sequence_logprobs`.

  Args:
    tokens, mask: as for `sequence_logprobs`: int32[B, L] right-padded rows, bool[B, L].
    split: a `PrefixSplit` from `split_shared_prefix(tokens, group_ids, mask, ...)` with this `mask` (or one
      reporting a subset of its positions), jit-compatible: pass it as an argument; or int[B] group ids,
      split here on the host (then tokens and mask must be concrete).
    trainable: with group ids, the tokens that may not be shared (default `mask`; pass the policy mask
      when `mask` is the input mask).
    prefix_logprobs: report masked positions inside shared prefixes (computed once per group); None (default):
      `split.prefix_reported`, i.e. only when the split's mask has such positions (never when mask =
      trainable, e.g. the policy mask). False leaves such positions 0.
    multiple: with group ids, the rounding of the split's widths.
  """
  if tokens.ndim != 2 or mask.shape != tokens.shape:
    raise ValueError(f"tokens and mask must both be [B, L], got {tokens.shape} and {mask.shape}")
  if not isinstance(split, PrefixSplit):
    split = split_shared_prefix(np.asarray(tokens), np.asarray(split), np.asarray(mask), trainable,
                                multiple=multiple)
  B, L = tokens.shape
  if split.row_group.shape != (B,):
    raise ValueError(f"split is for {split.row_group.shape[0]} rows, tokens have {B}")
  tokens = jnp.asarray(tokens, jnp.int32)
  mask = jnp.asarray(mask, bool)
  report_prefix = split.prefix_reported if prefix_logprobs is None else prefix_logprobs
  prefix_tokens, suffix_tokens, suffix_mask, prefix_mask = _split_rows(tokens, mask, split, report_prefix)
  Lp, Ls = split.prefix_width, split.suffix_width
  plen = jnp.asarray(split.prefix_len, jnp.int32)
  pre_lp, suf_lp = grouped_sequence_logprobs(graphdef, params, prefix_tokens, plen, suffix_tokens, suffix_mask,
                                             prefix_mask=prefix_mask, temperature=temperature,
                                             chunk_size=chunk_size)

  # Back to [B, L]: row b, position t reads its group's prefix (t < plen) or its own suffix (t - plen).
  n = jnp.asarray(split.row_group, jnp.int32)[:, None]  # [B, 1]
  g = jnp.asarray(split.row_slot, jnp.int32)[:, None]
  pos = jnp.arange(L, dtype=jnp.int32)[None, :]
  j = pos - plen[n]  # [B, L]
  out = jnp.where((j >= 0) & (j < Ls), suf_lp[n, g, jnp.clip(j, 0, Ls - 1)], 0.0)
  if pre_lp is not None:
    out = jnp.where(j < 0, pre_lp[n, jnp.clip(pos, 0, Lp - 1)], out)
  return jnp.where(mask & (pos > 0), out, 0.0)
