"""Decoder-only transformer (LLaMA / Qwen2 families) in Flax NNX.

Shapes: B batch, L tokens in this call, S cache slots, D hidden size, H query heads, K key/value heads,
G = H / K query heads per key/value head, d head size, F MLP hidden size, V vocabulary, N layers.

KV cache: {"k", "v"} each [N, B, K, S, d] (laid out by head). A token at position p is written to slot p
of its row; a query at position p attends to the slots s <= p of its row. Without a cache, a query at
position p attends to the given tokens of its row whose position is <= p.

Shared prefixes (optional, for the learner; see `leap_jax.sampling.shared_prefix`): a call with
`return_kv=True` returns each layer's keys/values of its own tokens, {"k", "v"} [N, P, K, Lp, d]; a later
call with `prefix_kv=` those and `prefix_valid` bool[P, Lp] runs B = P * R rows, rows p*R .. p*R + R - 1
attending to the valid keys of prefix p (all of them, whatever their position) plus their own causal keys.
The R rows of one prefix share its keys through the einsum's batch dimension; they are never copied.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from leap_jax.models.config import ModelConfig
from leap_jax.models.rope import apply_rope, rope_angles

Cache = dict[str, jax.Array]

_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


class ModelOutput(NamedTuple):
  """Result of `Transformer.__call__`.

  logits: f32[B, L, V], or None when return_logits=False.
  cache: the updated cache, or None when called without one (with return_kv: the call's own keys/values).
  hidden: [len(hidden_layers), B, L, D] residual streams (HF `output_hidden_states` indexing), or None.
  final_hidden: [B, L, D], the last layer's output after the final norm.
  """
  logits: jax.Array | None
  cache: Cache | None
  hidden: jax.Array | None
  final_hidden: jax.Array


def _normal(rngs: nnx.Rngs, shape: tuple[int, ...], dtype) -> nnx.Param:
  return nnx.Param(0.02 * jax.random.normal(rngs.params(), shape, jnp.float32).astype(dtype))


class RMSNorm(nnx.Module):
  """y = scale * x / sqrt(mean(x^2) + eps), normalised in f32: [..., D] -> [..., D]."""

  def __init__(self, dim: int, eps: float, param_dtype):
    self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.scale[...].astype(x.dtype) * y.astype(x.dtype)


class Attention(nnx.Module):
  """Grouped-query self-attention with RoPE and an optional slot-indexed KV cache."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.config = cfg
    D, H, K, d, pdt = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.weight_dtype
    self.q_proj = _normal(rngs, (D, H * d), pdt)
    self.k_proj = _normal(rngs, (D, K * d), pdt)
    self.v_proj = _normal(rngs, (D, K * d), pdt)
    self.o_proj = _normal(rngs, (H * d, D), pdt)
    if cfg.qkv_bias:
      self.q_bias = nnx.Param(jnp.zeros((H * d,), pdt))
      self.k_bias = nnx.Param(jnp.zeros((K * d,), pdt))
      self.v_bias = nnx.Param(jnp.zeros((K * d,), pdt))
    if cfg.o_bias:
      self.o_bias = nnx.Param(jnp.zeros((D,), pdt))

  def _project(self, x: jax.Array, name: str) -> jax.Array:
    dt = self.config.compute_dtype
    y = x @ getattr(self, f"{name}_proj")[...].astype(dt)
    if hasattr(self, f"{name}_bias"):
      y = y + getattr(self, f"{name}_bias")[...].astype(dt)
    return y

  def __call__(self, x: jax.Array, sin: jax.Array, cos: jax.Array, positions: jax.Array,
               cache: tuple[jax.Array, jax.Array, jax.Array | int] | None, attend_len: int | None = None,
               prefix: tuple[jax.Array, jax.Array, jax.Array] | None = None, return_kv: bool = False,
               segments: jax.Array | None = None) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
    """[B, L, D] -> [B, L, D].

    Args:
      x: [B, L, D] normalised residual stream, compute dtype.
      sin, cos: f32[B, L, d/2] RoPE angles of `positions`.
      positions: int32[B, L].
      cache: None, or (k, v, layer) with k, v [N, B, K, S, d] and layer the index to read and write.
      attend_len: with a cache, read only slots [0, attend_len) (static; every position must be below it).
      prefix: None, or (k, v, valid) with k, v [P, K, Lp, d] and valid bool[P, Lp]: B = P * R and rows
        p*R .. p*R + R - 1 also attend to the valid keys of prefix p (no cache then).
      return_kv: without a cache, return this call's own (k, v), each [B, K, L, d], instead of None.
      segments: None, or (no cache) int32[B, L]: a token attends only to this call's tokens of its own segment.

    Returns:
      The attention output and the updated (k, v), or this call's (k, v) with return_kv, or None.
    """
    cfg = self.config
    B, L, _ = x.shape
    H, K, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q = apply_rope(self._project(x, "q").reshape(B, L, H, d), sin, cos)
    k = apply_rope(self._project(x, "k").reshape(B, L, K, d), sin, cos)
    v = self._project(x, "v").reshape(B, L, K, d)
    if cache is None:
      keys, values = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
      key_positions = positions
      new_cache = (keys, values) if return_kv else None
    else:
      k_all, v_all, layer = cache
      rows = jnp.arange(B)[:, None]
      # Advanced indices (layer, rows, positions) broadcast to [B, L]; indexed value is [B, L, K, d].
      # Slots past the cache end are dropped.
      k_all = k_all.at[layer, rows, :, positions].set(k.astype(k_all.dtype), mode="drop")
      v_all = v_all.at[layer, rows, :, positions].set(v.astype(v_all.dtype), mode="drop")
      window = k_all.shape[3] if attend_len is None else min(attend_len, k_all.shape[3])
      keys = k_all[layer, :, :, :window].astype(x.dtype)
      values = v_all[layer, :, :, :window].astype(x.dtype)
      key_positions = jnp.broadcast_to(jnp.arange(window), (B, window))
      new_cache = (k_all, v_all)
    mask = key_positions[:, None, :] <= positions[:, :, None]  # [B, L, S]
    if L == 1 and prefix is None:
      return self._project(_one_query_attention(q, keys, values, mask[:, 0]), "o"), new_cache
    if segments is not None:
      mask = mask & (segments[:, None, :] == segments[:, :, None])
    q = q.reshape(B, L, K, H // K, d)
    scores = jnp.einsum("blkgd,bksd->bkgls", q, keys, preferred_element_type=jnp.float32) * d**-0.5
    scores = jnp.where(mask[:, None, None], scores, _MASK_VALUE)
    if prefix is None:
      probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
      out = jnp.einsum("bkgls,bksd->blkgd", probs, values).reshape(B, L, H * d)
      return self._project(out, "o"), new_cache
    # Shared prefix: one softmax over [prefix keys, own keys]; the R rows of a prefix are one einsum batch.
    pk, pv, valid = prefix
    P, Lp = valid.shape
    qp = q.reshape(P, B // P, L, K, H // K, d)
    pre = jnp.einsum("prlkgd,pksd->prkgls", qp, pk.astype(x.dtype),
                     preferred_element_type=jnp.float32) * d**-0.5
    pre = jnp.where(valid[:, None, None, None, None, :], pre, _MASK_VALUE).reshape(B, K, H // K, L, Lp)
    probs = jax.nn.softmax(jnp.concatenate([pre, scores], axis=-1), axis=-1).astype(x.dtype)
    pre_probs = probs[..., :Lp].reshape(P, B // P, K, H // K, L, Lp)
    out = (jnp.einsum("bkgls,bksd->blkgd", probs[..., Lp:], values)
           + jnp.einsum("prkgls,pksd->prlkgd", pre_probs, pv.astype(x.dtype)).reshape(B, L, K, H // K, d))
    return self._project(out.reshape(B, L, H * d), "o"), new_cache


def _one_query_attention(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array) -> jax.Array:
  """Attention of one query per row (a decode step), q [B, 1, H, d], keys / values [B, K, S, d], mask bool[B, S]
  -> [B, 1, H * d]: the general path's result, without its length axis of one, which costs XLA on CPU a
  transposed copy of the scores and of the output per layer (about 40% of a decode step's attention)."""
  B, _, H, d = q.shape
  K = keys.shape[1]
  q = q.reshape(B, K, H // K, d)
  scores = jnp.einsum("bkgd,bksd->bkgs", q, keys, preferred_element_type=jnp.float32) * d**-0.5
  scores = jnp.where(mask[:, None, None], scores, _MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
  return jnp.einsum("bkgs,bksd->bkgd", probs, values).reshape(B, 1, H * d)


class MLP(nnx.Module):
  """SwiGLU: down(silu(x W_gate) * (x W_up)), [..., D] -> [..., D]."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.config = cfg
    D, F, pdt = cfg.hidden_size, cfg.intermediate_size, cfg.weight_dtype
    self.gate_proj = _normal(rngs, (D, F), pdt)
    self.up_proj = _normal(rngs, (D, F), pdt)
    self.down_proj = _normal(rngs, (F, D), pdt)

  def __call__(self, x: jax.Array) -> jax.Array:
    dt = self.config.compute_dtype
    h = jax.nn.silu(x @ self.gate_proj[...].astype(dt)) * (x @ self.up_proj[...].astype(dt))
    return h @ self.down_proj[...].astype(dt)


class Block(nnx.Module):
  """Pre-norm decoder layer: h = x + attn(norm(x)); y = h + mlp(norm(h))."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.weight_dtype)
    self.attn = Attention(cfg, rngs=rngs)
    self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.weight_dtype)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x, sin, cos, positions, cache, attend_len=None, prefix=None, return_kv=False, segments=None):
    """[B, L, D] -> ([B, L, D], updated cache or None); arguments as in `Attention.__call__`."""
    a, cache = self.attn(self.attn_norm(x), sin, cos, positions, cache, attend_len, prefix, return_kv, segments)
    h = x + a
    return h + self.mlp(self.mlp_norm(h)), cache


class Transformer(nnx.Module):
  """LLaMA / Qwen2 decoder. Layer params are stacked on a leading [N] axis when `cfg.scan_layers`."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.config = cfg
    self.embedding = _normal(rngs, (cfg.vocab_size, cfg.hidden_size), cfg.weight_dtype)
    if cfg.scan_layers:
      @nnx.split_rngs(splits=cfg.num_layers)
      @nnx.vmap(in_axes=(0,), out_axes=0)
      def make_layers(rngs):
        return Block(cfg, rngs=rngs)
      self.layers = make_layers(rngs)
    else:
      self.layers = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.weight_dtype)
    if not cfg.tie_word_embeddings:
      self.lm_head = _normal(rngs, (cfg.hidden_size, cfg.vocab_size), cfg.weight_dtype)

  def logits_from_hidden(self, h: jax.Array) -> jax.Array:
    """Output layer: [..., D] -> f32[..., V]; uses the embedding matrix itself when tied."""
    dt = self.config.compute_dtype
    h = h.astype(dt)
    if self.config.tie_word_embeddings:
      return jnp.einsum("...d,vd->...v", h, self.embedding[...].astype(dt),
                        preferred_element_type=jnp.float32)
    return jnp.einsum("...d,dv->...v", h, self.lm_head[...].astype(dt),
                      preferred_element_type=jnp.float32)

  def __call__(self, tokens: jax.Array, positions: jax.Array, cache: Cache | None = None, *,
               hidden_layers: tuple[int, ...] = (), return_logits: bool = True,
               attend_len: int | None = None, return_kv: bool = False, prefix_kv: Cache | None = None,
               prefix_valid: jax.Array | None = None, segment_ids: jax.Array | None = None) -> ModelOutput:
    """Runs the decoder.

    Args:
      tokens: int32[B, L].
      positions: int32[B, L].
      cache: None or {"k", "v"} [N, B, K, S, d] from `init_cache`; token (b, l) is written to slot
        positions[b, l] (positions >= S are dropped) and attends to the slots <= positions[b, l].
      hidden_layers: indices i in [0, N] (negative counts from N + 1) of residual streams to return:
        i is the input of layer i, 0 the embedding output, N the last layer's output before the final norm.
      return_logits: compute f32[B, L, V] logits.
      attend_len: with a cache, attention reads only slots [0, attend_len) (a static int; every position
        must be below it). Samplers set it to the positions a call can reach, so a call's attention cost
        follows its episodes' lengths instead of the cache size S.
      return_kv: (no cache) return every layer's keys/values of this call's tokens as `cache`, {"k", "v"}
        [N, B, K, L, d] (RoPE applied; entry l is token l, whatever its position).
      prefix_kv: (no cache) {"k", "v"} [N, P, K, Lp, d], e.g. from a `return_kv=True` call on P prefixes;
        B must be a multiple R of P, and rows p*R .. p*R + R - 1 attend to prefix p's keys where
        `prefix_valid` (bool[P, Lp], default all) holds, then to their own tokens causally; positions should
        continue the prefix's (RoPE uses the given ones). Differentiable in both.
      segment_ids: (no cache) int32[B, L]: several sequences packed in a row; a token attends to the tokens
        of its own segment (causally, by position) and to the prefix, never to another segment.

    Returns:
      ModelOutput(logits, cache, hidden, final_hidden).
    """
    cfg = self.config
    hidden_layers = self._check_inputs(tokens, positions, cache, hidden_layers)
    prefix_valid = self._check_prefix(tokens, cache, return_kv, prefix_kv, prefix_valid)
    dt = cfg.compute_dtype
    x = jnp.take(self.embedding[...], tokens, axis=0).astype(dt)
    record = jnp.asarray(hidden_layers, jnp.int32)[:, None, None, None] if hidden_layers else None
    hidden = jnp.zeros((len(hidden_layers),) + x.shape, dt) if hidden_layers else None
    kv = None if cache is None else (cache["k"], cache["v"])
    prefix = None if prefix_kv is None else (prefix_kv["k"], prefix_kv["v"], prefix_valid)
    if segment_ids is not None and (cache is not None or segment_ids.shape != tokens.shape):
      raise ValueError(f"segment_ids must be [B, L] = {tokens.shape} and come without a cache, got "
                       f"{segment_ids.shape}{' with a cache' if cache is not None else ''}")
    step = self._layer_step(rope_angles(cfg, positions), positions, record, attend_len, return_kv, segment_ids)
    (x, hidden, kv), layer_kvs = self._run_layers(step, (x, hidden, kv), prefix)
    kv = layer_kvs if return_kv else kv
    if hidden is not None:
      hidden = jnp.where(record == cfg.num_layers, x[None], hidden)
    final_hidden = self.final_norm(x)
    logits = self.logits_from_hidden(final_hidden) if return_logits else None
    new_cache = None if kv is None else {"k": kv[0], "v": kv[1]}
    return ModelOutput(logits=logits, cache=new_cache, hidden=hidden, final_hidden=final_hidden)

  def _layer_step(self, sin_cos, positions, record, attend_len, return_kv, segments=None):
    """make_step(graphdef) -> step(layer_state, (x, hidden, kv), index, prefix_layer) -> (carry, layer_kv):
    one decoder layer, recording its input into `hidden` and, with return_kv, emitting its own keys/values."""
    sin, cos = sin_cos

    def make_step(graphdef):
      def step(layer_state, carry, index, prefix_layer=None):
        x, hidden, kv = carry
        if hidden is not None:
          hidden = jnp.where(record == index, x[None], hidden)
        layer = nnx.merge(graphdef, layer_state)
        x, layer_kv = layer(x, sin, cos, positions, None if kv is None else (*kv, index), attend_len,
                            prefix_layer, return_kv, segments)
        if return_kv:  # this layer's own keys/values leave as a per-layer output
          return (x, hidden, kv), layer_kv
        return (x, hidden, layer_kv), None
      if self.config.remat == "full":
        return jax.checkpoint(step, prevent_cse=not self.config.scan_layers)
      return step
    return make_step

  def _run_layers(self, make_step, carry, prefix):
    """All layers, scanned or looped: (final carry, stacked per-layer keys/values or None).

    prefix: None or (k, v, valid) with k, v [N, P, K, Lp, d]; layer i attends to (k[i], v[i], valid)."""
    num_layers = self.config.num_layers
    if self.config.scan_layers:
      graphdef, stacked = nnx.split(self.layers)
      step = make_step(graphdef)
      per_layer = None if prefix is None else (prefix[0], prefix[1])
      return jax.lax.scan(
          lambda c, xs: step(xs[0], c, xs[1], None if xs[2] is None else (*xs[2], prefix[2])), carry,
          (stacked, jnp.arange(num_layers, dtype=jnp.int32), per_layer))
    layer_kvs = []
    for i, layer in enumerate(self.layers):
      graphdef, layer_state = nnx.split(layer)
      prefix_layer = None if prefix is None else (prefix[0][i], prefix[1][i], prefix[2])
      carry, layer_kv = make_step(graphdef)(layer_state, carry, jnp.int32(i), prefix_layer)
      layer_kvs.append(layer_kv)
    if layer_kvs[0] is None:
      return carry, None
    return carry, jax.tree.map(lambda *a: jnp.stack(a), *layer_kvs)

  def _check_prefix(self, tokens, cache, return_kv, prefix_kv, prefix_valid) -> jax.Array | None:
    """Validates the shared-prefix arguments; returns prefix_valid (all True when not given) or None."""
    cfg = self.config
    if cache is not None and (return_kv or prefix_kv is not None):
      raise ValueError("return_kv and prefix_kv are only supported without a cache")
    if prefix_kv is None:
      if prefix_valid is not None:
        raise ValueError("prefix_valid given without prefix_kv")
      return None
    if set(prefix_kv) != {"k", "v"}:
      raise ValueError(f"prefix_kv must have keys 'k' and 'v', got {sorted(prefix_kv)}")
    shape = prefix_kv["k"].shape
    if (prefix_kv["v"].shape != shape or len(shape) != 5 or shape[0] != cfg.num_layers
        or shape[2] != cfg.num_kv_heads or shape[4] != cfg.head_dim):
      raise ValueError(f"prefix_kv shapes {shape}, {prefix_kv['v'].shape} must both be [N={cfg.num_layers}, "
                       f"P, K={cfg.num_kv_heads}, Lp, d={cfg.head_dim}]")
    P, Lp = shape[1], shape[3]
    if tokens.shape[0] % P:
      raise ValueError(f"batch {tokens.shape[0]} is not a multiple of the {P} prefixes")
    if prefix_valid is None:
      return jnp.ones((P, Lp), bool)
    if prefix_valid.shape != (P, Lp):
      raise ValueError(f"prefix_valid shape {prefix_valid.shape} must be [P={P}, Lp={Lp}]")
    return prefix_valid.astype(bool)

  def _check_inputs(self, tokens, positions, cache, hidden_layers) -> tuple[int, ...]:
    cfg = self.config
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be [B, L], got shape {tokens.shape}")
    if positions.shape != tokens.shape:
      raise ValueError(f"positions shape {positions.shape} must equal tokens shape {tokens.shape}")
    if not jnp.issubdtype(tokens.dtype, jnp.integer) or not jnp.issubdtype(positions.dtype, jnp.integer):
      raise ValueError(f"tokens and positions must be integers, got {tokens.dtype} and {positions.dtype}")
    if cache is not None:
      if set(cache) != {"k", "v"}:
        raise ValueError(f"cache must have keys 'k' and 'v', got {sorted(cache)}")
      for name in ("k", "v"):
        shape = cache[name].shape
        want = (cfg.num_layers, tokens.shape[0], cfg.num_kv_heads)
        if len(shape) != 5 or shape[:3] != want or shape[4] != cfg.head_dim:
          raise ValueError(f"cache[{name!r}] shape {shape} must be [N={want[0]}, B={want[1]}, "
                           f"K={want[2]}, S, d={cfg.head_dim}]")
    normalised = []
    for i in hidden_layers:
      j = i + cfg.num_layers + 1 if i < 0 else i
      if not 0 <= j <= cfg.num_layers:
        raise ValueError(f"hidden layer index {i} out of range for {cfg.num_layers} layers")
      normalised.append(j)
    return tuple(normalised)


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> Cache:
  """Zero KV cache {"k", "v"}, each [N, batch, K, max_len, d] in `dtype` (default: compute dtype)."""
  if batch <= 0 or max_len <= 0:
    raise ValueError(f"batch and max_len must be positive, got {batch} and {max_len}")
  shape = (cfg.num_layers, batch, cfg.num_kv_heads, max_len, cfg.head_dim)
  dtype = cfg.compute_dtype if dtype is None else jnp.dtype(dtype)
  return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
