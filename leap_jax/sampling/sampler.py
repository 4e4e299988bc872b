"""Batched multi-turn sampler: jitted prefill and `lax.while_loop` decode over a preallocated KV cache.

Shapes: P prompts, G samples per prompt, B = P * G rows of a batch, R rows in one call and Lp tokens of a
prompt, each padded to `buckets.bucket_length`'s ladder (..., 512, 640, 768, 896, 1024, 1280, ...),
T = max_new_tokens, S cache slots, V vocabulary.
Row r of a batch holds sample r % G of prompt r // G.

A row holds the tokens of one episode at positions 0, 1, ...; token p's key/value sits in cache slot p. Every
token of a row, the last sampled one included, must have a position < S. A call that cannot give a row at least
one new token, or that fills the row's last slot before a stop id or T tokens, finishes it as "truncated".

Keys: sample i of row r in a call uses fold_in(k_r, i), where k_r is the row's key (given per row, or
fold_in(key, r) for the row's batch index r), so the samples of a row do not depend on which other rows share
the call.

Log-probs: log softmax(logits / temperature)[token] over the full vocabulary, before top-k / top-p truncation,
the definition `sequence_logprobs` uses (greedy decoding reports temperature-1 log-probs).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from leap_jax.models import ModelConfig, init_cache
from leap_jax.sampling.buckets import bucket_length
from leap_jax.sampling.logprobs import token_logprobs

FINISH_REASONS = ("stop", "length", "truncated")
_STOP, _LENGTH, _TRUNCATED, _RUNNING = 0, 1, 2, -1


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How tokens are drawn.

  temperature: tau; 0 means greedy (argmax).
  top_p: keep the smallest set of most likely tokens whose probability reaches top_p (1 keeps all).
  top_k: keep the k most likely tokens (0 keeps all); applied before top_p.
  """
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0

  def __post_init__(self):
    if self.temperature < 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0, got {self.top_k}")


def sample_logits(logits: jax.Array, keys: jax.Array, step: jax.Array, params: SamplingParams
                  ) -> tuple[jax.Array, jax.Array]:
  """Draws one token per row.

  Args:
    logits: f32[R, V].
    keys: [R] typed PRNG keys, one per row.
    step: int32 scalar, folded into every row key.
    params: the sampling rule.

  Returns:
    (tokens int32[R], logprobs f32[R]) with logprobs as in the module docstring.
  """
  logits = logits.astype(jnp.float32)
  if params.temperature == 0:
    tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  else:
    z = logits / params.temperature
    V = z.shape[-1]
    k = V if params.top_k == 0 else min(params.top_k, V)
    if k < V or params.top_p < 1:
      values, ids = jax.lax.top_k(z, k)  # [R, k], sorted descending
      if params.top_p < 1:
        probs = jax.nn.softmax(values, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of strictly more likely tokens
        values = jnp.where(before < params.top_p, values, -jnp.inf)
      keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, step)
      pick = jax.vmap(jax.random.categorical)(keys, values)
      tokens = jnp.take_along_axis(ids, pick[:, None], axis=-1)[:, 0].astype(jnp.int32)
    else:
      keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, step)
      tokens = jax.vmap(jax.random.categorical)(keys, z).astype(jnp.int32)
  return tokens, token_logprobs(logits, tokens, params.temperature)


@dataclasses.dataclass(frozen=True)
class Completion:
  """New tokens of one row from one call.

  row: the row's index in the batch state.
  tokens: int32[n] sampled ids (a stop id, when hit, is the last one).
  logprobs: f32[n] their sampler log-probs.
  finish_reason: "stop", "length" (max_new_tokens reached) or "truncated" (the cache is full).
  """
  row: int
  tokens: np.ndarray
  logprobs: np.ndarray
  finish_reason: str


@dataclasses.dataclass
class SamplerState:
  """A batch of episodes between turns.

  cache: {"k", "v"} [N, B, K, S', d] with S' <= cache_len; consumed by the next `continue_` call (its
    buffers are donated).
  lengths: int[B] tokens each row holds (all turns).
  last_tokens: int[B] each row's last token; its key/value may not be in the cache yet.
  prompt_index: int[B] the prompt each row was sampled from.
  """
  cache: dict[str, jax.Array]
  lengths: np.ndarray
  last_tokens: np.ndarray
  prompt_index: np.ndarray

  @property
  def num_rows(self) -> int:
    return len(self.lengths)


def _decode(model, cache, logits, first_position, last, keys, done, *, params: SamplingParams,
            max_new_tokens: int, stop_ids: tuple[int, ...], cache_len: int, pad_id: int, attend_len: int):
  """Samples up to T tokens per row after a prefill; attention reads slots [0, attend_len), which must hold
  every position the call writes.

  Args:
    model: the merged Transformer.
    cache: {"k", "v"} [N, R, K, S, d] holding every row's tokens before `first_position`.
    logits: f32[R, V] predicting each row's first new token.
    first_position: int32[R] position of each row's first new token.
    last: int32[R] each row's token at first_position - 1.
    keys: [R] typed PRNG keys.
    done: bool[R] rows that get no token (finished as truncated).

  Returns:
    (cache, tokens int32[R, T], logprobs f32[R, T], count int32[R], reason int32[R]).
  """
  R = logits.shape[0]
  T = max_new_tokens
  stops = jnp.asarray(stop_ids if stop_ids else (-1,), jnp.int32)

  def take(i, logits, tokens, logprobs, last, count, reason):
    new, lp = sample_logits(logits, keys, i, params)
    active = reason == _RUNNING
    tokens = tokens.at[:, i].set(jnp.where(active, new, pad_id))
    logprobs = logprobs.at[:, i].set(jnp.where(active, lp, 0.0))
    count = count + active
    last = jnp.where(active, new, last)
    finished = jnp.where(jnp.isin(new, stops), _STOP,
                         jnp.where(count == T, _LENGTH,
                                   jnp.where(first_position + count >= cache_len, _TRUNCATED, _RUNNING)))
    reason = jnp.where(active, finished, reason)
    return tokens, logprobs, last, count, reason

  tokens = jnp.full((R, T), pad_id, jnp.int32)
  logprobs = jnp.zeros((R, T), jnp.float32)
  count = jnp.zeros((R,), jnp.int32)
  reason = jnp.where(done, _TRUNCATED, _RUNNING).astype(jnp.int32)
  tokens, logprobs, last, count, reason = take(0, logits, tokens, logprobs, last, count, reason)

  def cond(carry):
    i, _, _, _, _, _, reason = carry
    return (i < T) & jnp.any(reason == _RUNNING)

  def body(carry):
    i, cache, tokens, logprobs, last, count, reason = carry
    # Finished rows re-feed their last token at its own position: an idempotent cache write.
    positions = jnp.maximum(first_position + count - 1, 0)[:, None]
    out = model(last[:, None], positions, cache, return_logits=False, attend_len=attend_len)
    logits = model.logits_from_hidden(out.final_hidden[:, 0])
    tokens, logprobs, last, count, reason = take(i, logits, tokens, logprobs, last, count, reason)
    return i + 1, out.cache, tokens, logprobs, last, count, reason

  carry = (jnp.int32(1), cache, tokens, logprobs, last, count, reason)
  _, cache, tokens, logprobs, _, count, reason = jax.lax.while_loop(cond, body, carry)
  return cache, tokens, logprobs, count, reason


def _last_logits(model, hidden: jax.Array, lengths: jax.Array) -> jax.Array:
  """Logits at each row's last real token: hidden [R, L, D], lengths int32[R] -> f32[R, V]."""
  index = jnp.clip(lengths - 1, 0, hidden.shape[1] - 1)
  return model.logits_from_hidden(hidden[jnp.arange(hidden.shape[0]), index])


def _grow(cache: jax.Array, slots: int) -> jax.Array:
  """A cache [N, B, K, S, d] with at least `slots` slots (new slots zero)."""
  extra = slots - cache.shape[3]
  return jnp.pad(cache, [(0, 0)] * 3 + [(0, extra), (0, 0)]) if extra > 0 else cache


class Sampler:
  """Samples all live episodes of a rollout in one batched call per turn.

  Usage:
    sampler = Sampler(graphdef, cfg, cache_len=4096, stop_ids=chat.stop_ids)
    state, outs = sampler.start(params, prompts, num_samples=8, key=key, max_new_tokens=1024)
    state, outs = sampler.continue_(params, state, rows, feedback_ids, key=key2, max_new_tokens=1024)

  Args:
    graphdef: the model's graph definition, from `nnx.split(model)`.
    cfg: its ModelConfig.
    cache_len: S, the most slots per row; size it for all turns of an episode. A call's cache holds only the
      bucket of slots its positions reach (attention reads no more), growing between turns.
    stop_ids: ids that end a completion (kept as its last token).
    pad_id: id written after a row's last sampled token in the output buffers.
    min_bucket: smallest prompt bucket.
    cache_dtype: KV cache dtype (default: the model's compute dtype).
  """

  def __init__(self, graphdef: nnx.GraphDef, cfg: ModelConfig, *, cache_len: int,
               stop_ids: Sequence[int] = (), pad_id: int = 0, min_bucket: int = 16, cache_dtype=None):
    if cache_len <= 1:
      raise ValueError(f"cache_len must be > 1, got {cache_len}")
    self.graphdef = graphdef
    self.cfg = cfg
    self.cache_len = int(cache_len)
    self.stop_ids = tuple(int(s) for s in stop_ids)
    self.pad_id = int(pad_id)
    self.min_bucket = int(min_bucket)
    self.cache_dtype = cache_dtype
    self._start = jax.jit(self._start_impl, static_argnames=("num_samples", "max_new_tokens", "params", "window"))
    self._continue = jax.jit(self._continue_impl, static_argnames=("max_new_tokens", "params", "window"),
                             donate_argnames=("cache",))

  def _window(self, end: int) -> int:
    """Cache slots a call reads when its positions stay below `end`: on the bucket ladder, at most S."""
    return min(bucket_length(end, self.min_bucket), self.cache_len)

  def _decode_kwargs(self, params: SamplingParams, max_new_tokens: int, window: int) -> dict:
    return dict(params=params, max_new_tokens=max_new_tokens, stop_ids=self.stop_ids,
                cache_len=self.cache_len, pad_id=self.pad_id, attend_len=window)

  def _start_impl(self, weights, prompts, lengths, done, keys, *, num_samples, max_new_tokens, params, window):
    model = nnx.merge(self.graphdef, weights)
    P, Lp = prompts.shape
    cache = init_cache(self.cfg, P, window, self.cache_dtype)
    positions = jnp.broadcast_to(jnp.arange(Lp, dtype=jnp.int32), (P, Lp))
    # Padding past the window writes no key (dropped); real tokens are all below it.
    out = model(prompts, positions, cache, return_logits=False, attend_len=Lp)
    logits = _last_logits(model, out.final_hidden, lengths)
    repeat = functools.partial(jnp.repeat, repeats=num_samples, axis=0)
    cache = {name: jnp.repeat(c, num_samples, axis=1) for name, c in out.cache.items()}
    last = prompts[jnp.arange(P), jnp.clip(lengths - 1, 0, Lp - 1)]
    return _decode(model, cache, repeat(logits), repeat(lengths), repeat(last), keys, done,
                   **self._decode_kwargs(params, max_new_tokens, window))

  def _continue_impl(self, weights, cache, rows, tokens, starts, lengths, keys, *, max_new_tokens, params,
                     window):
    model = nnx.merge(self.graphdef, weights)
    R, Lp = tokens.shape
    sub = {name: jnp.take(c, rows, axis=1, mode="clip") for name, c in cache.items()}
    positions = starts[:, None] + jnp.arange(Lp, dtype=jnp.int32)[None, :]
    # Padding positions of a row may pass the window: their keys are written but no real query reads them.
    out = model(tokens, positions, sub, return_logits=False, attend_len=window)
    logits = _last_logits(model, out.final_hidden, lengths)
    sub, new_tokens, logprobs, count, reason = _decode(
        model, out.cache, logits, starts + lengths, tokens[jnp.arange(R), lengths - 1], keys,
        jnp.zeros((R,), bool),
        **self._decode_kwargs(params, max_new_tokens, window))
    cache = {name: c.at[:, rows].set(sub[name], mode="drop") for name, c in cache.items()}
    return cache, new_tokens, logprobs, count, reason

  def start(self, weights: nnx.State, prompts: Sequence[Sequence[int]], num_samples: int, key: jax.Array, *,
            max_new_tokens: int, sampling: SamplingParams = SamplingParams()
            ) -> tuple[SamplerState, list[Completion]]:
    """Prefills each prompt once, then samples `num_samples` completions of it.

    Args:
      weights: model parameters (nnx.State).
      prompts: P lists of token ids (each non-empty).
      num_samples: G completions per prompt; rows r = p * G + g.
      key: one PRNG key (row r uses fold_in(key, r)) or B row keys.
      max_new_tokens: T.
      sampling: temperature / top-p / top-k.

    Returns:
      (state for `continue_`, B completions in row order).
    """
    if not prompts:
      raise ValueError("start needs at least one prompt")
    if num_samples <= 0 or max_new_tokens <= 0:
      raise ValueError(f"num_samples and max_new_tokens must be positive, got {num_samples}, {max_new_tokens}")
    prompts = [_check_ids(f"prompt {i}", p) for i, p in enumerate(prompts)]
    P, G, S = len(prompts), num_samples, self.cache_len
    true_lengths = np.array([len(p) for p in prompts], np.int32)
    Lp = min(bucket_length(true_lengths.max(), self.min_bucket), S)
    tokens = np.full((P, Lp), self.pad_id, np.int32)
    for i, p in enumerate(prompts):
      tokens[i, :min(len(p), Lp)] = p[:Lp]
    B = P * G
    keys = _row_keys(key, np.arange(B), B)
    done = np.repeat(true_lengths >= S, G)
    cache, new, logprobs, count, reason = self._start(
        weights, jnp.asarray(tokens), jnp.asarray(np.minimum(true_lengths, Lp)), jnp.asarray(done), keys,
        num_samples=G, max_new_tokens=max_new_tokens, params=sampling,
        window=self._window(int(true_lengths.max()) + max_new_tokens))
    lengths = np.repeat(true_lengths, G)
    last = np.repeat(np.array([p[-1] for p in prompts], np.int32), G)
    state = SamplerState(cache=cache, lengths=lengths, last_tokens=last, prompt_index=np.repeat(np.arange(P), G))
    return state, self._collect(state, np.arange(B), new, logprobs, count, reason)

  def continue_(self, weights: nnx.State, state: SamplerState, rows: Sequence[int],
                new_turn_tokens: Sequence[Sequence[int]], key: jax.Array, *, max_new_tokens: int,
                sampling: SamplingParams = SamplingParams()) -> tuple[SamplerState, list[Completion]]:
    """Appends a turn to some rows (prefill at each row's offset) and samples their next completions.

    Args:
      weights: model parameters.
      state: from `start` or a previous `continue_`; its cache is consumed.
      rows: distinct row indices of the state to extend.
      new_turn_tokens: per row, the ids of the new turn (e.g. `ChatFormat.feedback_turn`), non-empty.
      key: one PRNG key (row r uses fold_in(key, r)) or len(rows) row keys.
      max_new_tokens: T.
      sampling: temperature / top-p / top-k.

    Returns:
      (the new state, one completion per row in `rows` order). A row whose new turn leaves no free slot is
      finished as truncated with no tokens and its cache row is left as it was.
    """
    rows = np.asarray(rows, np.int64).reshape(-1)
    _check_continue_args(state, rows, new_turn_tokens, max_new_tokens)
    turns = [_check_ids(f"new turn of row {r}", t) for r, t in zip(rows, new_turn_tokens)]
    all_keys = _row_keys(key, rows, len(rows))
    fits = np.array([state.lengths[r] + len(t) < self.cache_len for r, t in zip(rows, turns)], bool)
    results: dict[int, Completion] = {
        int(r): Completion(int(r), np.zeros((0,), np.int32), np.zeros((0,), np.float32), "truncated")
        for r, ok in zip(rows, fits) if not ok}
    live = np.flatnonzero(fits)
    if len(live):
      state, completions = self._continue_rows(weights, state, rows[live], [turns[i] for i in live],
                                               all_keys[live], max_new_tokens=max_new_tokens, sampling=sampling)
      results.update((c.row, c) for c in completions)
    return state, [results[int(r)] for r in rows]

  def _continue_rows(self, weights: nnx.State, state: SamplerState, rows: np.ndarray, turns: list[list[int]],
                     keys: jax.Array, *, max_new_tokens: int, sampling: SamplingParams
                     ) -> tuple[SamplerState, list[Completion]]:
    """`continue_` for n rows whose new turn leaves a free slot, in one padded call of R rows.

    Args:
      rows: int[n] distinct row indices of the state.
      turns: per row, the ids of its new turn.
      keys: [n] typed PRNG keys, one per row.

    Returns:
      (the new state with the turns and completions appended, n completions in `rows` order).
    """
    index, tokens, starts, lengths = self._new_turn_prefill(state, rows, turns)
    n, R = len(rows), len(index)
    keys = keys[np.concatenate([np.arange(n), np.zeros(R - n, np.int64)])]  # padding rows reuse the first key
    window = self._window(int((starts + lengths).max()) + max_new_tokens)
    cache = {name: _grow(c, window) for name, c in state.cache.items()}  # outside the call: donation holds
    cache, new, logprobs, count, reason = self._continue(
        weights, cache, jnp.asarray(index), jnp.asarray(tokens), jnp.asarray(starts),
        jnp.asarray(lengths), keys, max_new_tokens=max_new_tokens, params=sampling, window=window)
    state = dataclasses.replace(state, cache=cache, lengths=state.lengths.copy(),
                                last_tokens=state.last_tokens.copy())
    for r, turn in zip(rows, turns):
      state.lengths[r] += len(turn)
    return state, self._collect(state, rows, new[:n], logprobs[:n], count[:n], reason[:n])

  def _new_turn_prefill(self, state: SamplerState, rows: np.ndarray, turns: list[list[int]]
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The prefill inputs of n new turns, padded to R = bucket_length(n, 1) rows of Lp tokens.

    Row j prefills rows[j]'s last token (its key/value may not be in the cache yet) and then turns[j], from
    position state.lengths[rows[j]] - 1.

    Args:
      rows: int[n] row indices of the state.
      turns: per row, the ids of its new turn (non-empty, fitting the cache).

    Returns:
      (index int32[R] the state rows, past the batch for padding rows so their cache writes are dropped;
      tokens int32[R, Lp]; starts int32[R] each row's first position; lengths int32[R] its real tokens).
    """
    R = bucket_length(len(rows), 1)
    Lp = min(bucket_length(max(len(t) for t in turns) + 1, self.min_bucket), self.cache_len)
    index = np.full((R,), state.num_rows, np.int32)  # padding rows point past the batch: writes dropped
    tokens = np.full((R, Lp), self.pad_id, np.int32)
    starts = np.zeros((R,), np.int32)
    lengths = np.ones((R,), np.int32)
    for j, (r, turn) in enumerate(zip(rows, turns)):
      index[j] = r
      tokens[j, 0] = state.last_tokens[r]
      tokens[j, 1:len(turn) + 1] = turn
      starts[j] = state.lengths[r] - 1
      lengths[j] = len(turn) + 1
    return index, tokens, starts, lengths

  def _collect(self, state: SamplerState, rows: np.ndarray, new, logprobs, count, reason) -> list[Completion]:
    """Moves a call's outputs to the host, updates the state's lengths / last tokens in place."""
    new, logprobs, count, reason = jax.device_get((new, logprobs, count, reason))
    out = []
    for j, r in enumerate(rows):
      n = int(count[j])
      if n:
        state.lengths[r] += n
        state.last_tokens[r] = new[j, n - 1]
      out.append(Completion(int(r), new[j, :n].astype(np.int32), logprobs[j, :n].astype(np.float32),
                            FINISH_REASONS[int(reason[j])]))
    return out


def row_keys(seed: int, step: int, episodes: Sequence[int], turn: int) -> jax.Array:
  """Per-row keys derived from (seed, step, episode, turn): [R] typed PRNG keys."""
  base = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), step), turn)
  return jax.vmap(lambda e: jax.random.fold_in(base, e))(jnp.asarray(episodes, jnp.uint32))


def _row_keys(key: jax.Array, rows: np.ndarray, count: int) -> jax.Array:
  """[count] typed keys: fold_in(key, row) for one key, or the given per-row keys."""
  key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
  if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.wrap_key_data(key)
  if key.ndim == 0:
    return jax.vmap(lambda r: jax.random.fold_in(key, r))(jnp.asarray(rows, jnp.uint32))
  if key.shape != (count,):
    raise ValueError(f"expected one key or {count} row keys, got keys of shape {key.shape}")
  return key


def _check_continue_args(state: SamplerState, rows: np.ndarray, new_turn_tokens: Sequence[Sequence[int]],
                         max_new_tokens: int) -> None:
  """Raises ValueError unless `rows` (int[n]) are distinct rows of `state`, one per new turn, and T > 0."""
  if len(rows) != len(new_turn_tokens):
    raise ValueError(f"{len(rows)} rows but {len(new_turn_tokens)} new turns")
  if len(set(rows.tolist())) != len(rows):
    raise ValueError("rows must be distinct")
  if len(rows) and (rows.min() < 0 or rows.max() >= state.num_rows):
    raise ValueError(f"rows must be in [0, {state.num_rows}), got {rows.min()}..{rows.max()}")
  if max_new_tokens <= 0:
    raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")


def _check_ids(name: str, ids: Sequence[int]) -> list[int]:
  ids = [int(i) for i in ids]
  if not ids:
    raise ValueError(f"{name} is empty")
  if min(ids) < 0:
    raise ValueError(f"{name} has a negative id {min(ids)}")
  return ids
