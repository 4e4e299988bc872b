"""Shared-prefix (Prefix Grouper) log-probs equal the per-episode `sequence_logprobs`: values and gradients.

Tiny float32 LLaMA / Qwen2 models with GQA; groups with ragged prefix lengths, ragged group sizes, multi-turn
suffixes (answer, feedback, answer: only answers trained) right-padded to ragged lengths; scanned and looped
layers, remat; a sharded ("data", "fsdp", "tensor") mesh of fake CPU devices.
"""
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from leap_jax.models import (ModelConfig, batch_spec, expected_shapes, init_cache, make_mesh, model_from_flat,
                             shard_model)
from leap_jax.sampling import sequence_logprobs
from leap_jax.sampling.shared_prefix import (PrefixSplit, grouped_sequence_logprobs, shared_prefix_logprobs,
                                             split_shared_prefix)

V = 64
PAD = 0


def tiny_config(kind: str, **overrides) -> ModelConfig:
  base = dict(model_type=kind, vocab_size=V, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
              num_kv_heads=2, head_dim=8, rope_theta=100.0)
  if kind == "qwen2":
    base.update(qkv_bias=True, tie_word_embeddings=True)
  base.update(overrides)
  return ModelConfig(**base)


def model_parts(cfg: ModelConfig, seed: int = 0):
  """(graphdef, state) with N(0, 0.06^2) matrices (3x the usual init, so attention is far from uniform:
  attending to one prefix padding slot, or a position off by one, moves log-probs by > 0.3), N(0, 0.1^2)
  biases and 1 + N(0, 0.1^2) norm scales. Built from numpy: eager initialisation would cost seconds."""
  rng = np.random.default_rng(seed)
  flat = {}
  for name, shape in expected_shapes(cfg).items():
    if name.endswith("scale"):
      flat[name] = 1.0 + 0.1 * rng.standard_normal(shape)
    else:
      flat[name] = (0.1 if name.endswith("_bias") else 0.06) * rng.standard_normal(shape)
  return nnx.split(model_from_flat(cfg, {k: v.astype(np.float32) for k, v in flat.items()}))


def make_batch(seed: int, prefix_lens, group_sizes, L: int):
  """Rows = group prompt ++ answer (trained) ++ feedback ++ answer (trained), right-padded, rows shuffled.

  Every row of a group also starts its first answer with the same token, which must not be shared (trained).
  Returns tokens int32[B, L], input_mask, policy_mask bool[B, L], group_ids int[B], prompt lengths per row.
  """
  rng = np.random.default_rng(seed)
  rows, inputs, policy, gids, plens = [], [], [], [], []
  for n, (p, size) in enumerate(zip(prefix_lens, group_sizes)):
    prompt = rng.integers(1, V, p)
    first = rng.integers(1, V)
    for _ in range(size):
      a1, f, a2 = rng.integers(1, 5), rng.integers(1, 4), rng.integers(1, 5)
      answer1 = np.concatenate([[first], rng.integers(1, V, a1 - 1)])
      parts = [(prompt, False), (answer1, True), (rng.integers(1, V, f), False), (rng.integers(1, V, a2), True)]
      seq = np.concatenate([x for x, _ in parts])
      pol = np.concatenate([np.full(len(x), t) for x, t in parts])
      assert len(seq) <= L
      rows.append(np.pad(seq, (0, L - len(seq)), constant_values=PAD))
      inputs.append(np.arange(L) < len(seq))
      policy.append(np.pad(pol, (0, L - len(seq))))
      gids.append(10 * n + 7)
      plens.append(p)
  perm = rng.permutation(len(rows))
  take = lambda xs: np.stack(xs)[perm]
  return (take(rows).astype(np.int32), take(inputs), take(policy).astype(bool), np.asarray(gids)[perm],
          np.asarray(plens)[perm])


def run_jitted(fn, *args):
  """jax.jit(fn)(*args), compiled at XLA backend optimisation level 0: half the compile time of these tests
  (which is most of their time on the CPU), the same arithmetic."""
  return jax.jit(fn).lower(*args).compile(compiler_options={"xla_backend_optimization_level": 0})(*args)


def assert_tree_close(a, b, rtol, atol):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol), a, b)


def test_split_on_host():
  tokens = np.array([
      [5, 6, 7, 8, 9, 1, 0, 0],   # group A
      [5, 6, 7, 8, 2, 2, 2, 0],   # group A: differs at t=4
      [5, 6, 7, 3, 3, 0, 0, 0],   # group B, a group of one row: shares until its first trained token
      [5, 6, 7, 8, 9, 4, 0, 0],   # group A: the common prefix is [5 6 7 8]
      [1, 2, 3, 4, 0, 0, 0, 0],   # group C: trained from t=2 in one row
      [1, 2, 3, 4, 5, 6, 7, 0],   # group C
  ])
  policy = np.zeros_like(tokens, bool)
  policy[[0, 1, 3], 4:6] = True
  policy[2, 3:5] = True
  policy[4, 2:4] = True
  policy[5, 5:7] = True
  split = split_shared_prefix(tokens, np.array([3, 3, 1, 3, 9, 9]), policy, multiple=4, group_multiple=2)
  assert isinstance(split, PrefixSplit)
  np.testing.assert_array_equal(split.row_group, [0, 0, 1, 0, 2, 2])
  np.testing.assert_array_equal(split.row_slot, [0, 1, 0, 2, 0, 1])
  np.testing.assert_array_equal(split.group_rows, [[0, 1, 3], [2, -1, -1], [4, 5, -1], [0, -1, -1]])
  np.testing.assert_array_equal(split.prefix_len, [4, 3, 2, 0])
  # Longest suffix: row 5, reported up to t=6 from prefix 2 -> 5 positions, rounded up to 8.
  assert (split.prefix_width, split.suffix_width) == (4, 8)
  assert split.tokens_per_pass == 4 * (4 + 3 * 8) and not split.prefix_reported
  # Sharing stops at a row's last reported position: one row, nothing trained.
  one = split_shared_prefix(tokens[:1], np.zeros(1), np.zeros((1, 8), bool), multiple=1)
  assert one.prefix_len.tolist() == [0] and (one.prefix_width, one.suffix_width) == (1, 1)
  # Reporting all input tokens but sharing the untrained ones (the learner's input_mask / policy_mask).
  both = split_shared_prefix(tokens, np.array([3, 3, 1, 3, 9, 9]), tokens > 0, policy, multiple=1)
  np.testing.assert_array_equal(both.prefix_len, [4, 3, 2])
  assert both.prefix_reported
  with pytest.raises(ValueError, match="group_ids"):
    split_shared_prefix(tokens, np.zeros(3), policy)


def test_transformer_kv_and_prefix_arguments():
  """return_kv equals a prefilled cache; prefix_kv attention equals the full forward on the concatenation."""
  cfg = tiny_config("qwen2")
  graphdef, state = model_parts(cfg)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, V, (2, 9)), jnp.int32)
  pos = jnp.broadcast_to(jnp.arange(9, dtype=jnp.int32), (2, 9))

  def run(state):
    model = nnx.merge(graphdef, state)
    full = model(tokens, pos).logits
    cache = model(tokens[:, :4], pos[:, :4], init_cache(cfg, 2, 6)).cache
    kv = model(tokens[:, :4], pos[:, :4], return_kv=True).cache
    # Prefix = row 0's first 4 tokens (valid: 3 of them + one garbage slot); two rows continue it at t=3.
    kv = jax.tree.map(lambda x: x[:, :1], kv)
    rest = jnp.stack([tokens[0, 3:], tokens[0, 3:]])
    valid = jnp.array([[True, True, True, False]])
    out = model(rest, pos[:, 3:], prefix_kv=kv, prefix_valid=valid).logits
    return full, cache, kv, out

  full, cache, kv, out = run_jitted(run, state)
  np.testing.assert_allclose(kv["k"], cache["k"][:, :1, :, :4], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(kv["v"], cache["v"][:, :1, :, :4], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out[0], full[0, 3:], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out[1], full[0, 3:], rtol=1e-5, atol=1e-5)
  model = nnx.merge(graphdef, state)
  with pytest.raises(ValueError, match="without a cache"):
    model(tokens, pos, init_cache(cfg, 2, 9), return_kv=True)
  with pytest.raises(ValueError, match="not a multiple"):
    model(tokens[:, :3], pos[:, :3], prefix_kv=jax.tree.map(lambda x: jnp.concatenate([x] * 3, 1), kv))


CASES = [
    # kind, scan_layers, remat, group sizes, prefix lengths, reported positions (mask), sharded mesh
    ("llama", True, "full", (3, 3, 2), (11, 6, 9), "policy", True),
    ("qwen2", False, "full", (3, 1, 2), (7, 12, 4), "input", False),
    ("qwen2", True, "none", (1, 1, 1), (9, 5, 13), "policy", False),
]


@pytest.mark.parametrize("kind,scan,remat,sizes,prefix_lens,report,sharded", CASES)
def test_logprobs_and_gradients_match_per_episode(kind, scan, remat, sizes, prefix_lens, report, sharded):
  """value_and_grad of sum(w * policy_mask * logp): shared-prefix path vs per-episode `sequence_logprobs`.

  "input" reports every real token (the learner passes input_mask) and shares only untrained ones, so the
  shared prompt's own log-probs come from the prefix pass. The sharded case runs the shared path on a
  data x fsdp x tensor mesh of the 8 fake CPU devices conftest sets up (params, rows and split sharded),
  with the 3 groups padded to 4 (`group_multiple`), against the single-device per-episode path.
  """
  if sharded and jax.device_count() < 8:
    pytest.skip("needs --xla_force_host_platform_device_count=8 (set by conftest)")
  cfg = tiny_config(kind, scan_layers=scan, remat=remat)
  graphdef, state = model_parts(cfg, seed=len(sizes))
  tokens, input_mask, policy, gids, plens = make_batch(sum(prefix_lens), prefix_lens, sizes, L=28)
  mask = policy if report == "policy" else input_mask
  split = split_shared_prefix(tokens, gids, mask, policy, multiple=4, group_multiple=4 if sharded else 1)
  # Shared exactly the prompt: rows of size > 1 groups diverge at their (shared, but trained) first token.
  np.testing.assert_array_equal(split.prefix_len[split.row_group], plens)
  assert split.prefix_reported == (report == "input")
  weights = jnp.asarray(np.random.default_rng(1).standard_normal(tokens.shape), jnp.float32)

  def loss(state, tokens, mask, split):
    lp = (sequence_logprobs(graphdef, state, tokens, mask, chunk_size=8) if split is None else
          shared_prefix_logprobs(graphdef, state, tokens, mask, split, chunk_size=8))
    return jnp.sum(weights * jnp.where(jnp.asarray(policy), lp, 0.0)), lp

  grad = jax.value_and_grad(loss, has_aux=True)
  (want_loss, want), want_g = run_jitted(grad, state, jnp.asarray(tokens), jnp.asarray(mask), None)
  if sharded:
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    state = nnx.state(shard_model(nnx.merge(graphdef, state), mesh))
    put = lambda x: jax.device_put(jnp.asarray(x), NamedSharding(mesh, batch_spec(mesh, x.shape[0], x.ndim)))
    tokens, mask, split = put(tokens), put(mask), jax.tree.map(put, split)
    assert len(split.group_rows.sharding.device_set) == 8 and split.num_groups == 4
    assert not state["layers"]["attn"]["q_proj"][...].sharding.is_fully_replicated
  (got_loss, got), got_g = run_jitted(grad, state, jnp.asarray(tokens), jnp.asarray(mask), split)
  assert np.count_nonzero(np.asarray(want)) == np.count_nonzero(np.asarray(mask)[:, 1:])
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5, atol=1e-5)
  assert sum(float(jnp.sum(g**2)) for g in jax.tree.leaves(want_g)) > 1.0
  assert_tree_close(got_g, want_g, rtol=1e-5, atol=1e-5)


def _shapes(jaxpr, out):
  for eqn in jaxpr.eqns:
    out.update(tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      _shapes(sub, out)
  return out


def test_prefix_keys_are_not_copied_per_suffix():
  """No forward or backward intermediate holds G copies of a prefix's keys/values ([.., G, .., Lp, d])."""
  N, G, Lp, Ls = 2, 3, 5, 7
  cfg = tiny_config("qwen2")  # K=2 heads of d=8
  graphdef, state = model_parts(cfg)
  rng = np.random.default_rng(0)
  prefix = jnp.asarray(rng.integers(0, V, (N, Lp)), jnp.int32)
  suffix = jnp.asarray(rng.integers(0, V, (N, G, Ls)), jnp.int32)

  def loss(s):
    _, lp = grouped_sequence_logprobs(graphdef, s, prefix, jnp.array([5, 3]), suffix, jnp.ones((N, G, Ls), bool))
    return jnp.sum(lp)

  shapes = _shapes(jax.make_jaxpr(jax.grad(loss))(state).jaxpr, set())
  assert (cfg.num_layers, N, 2, Lp, 8) in shapes  # the prefix's keys, once
  copies = [s for s in shapes if Lp in s and 8 in s and (G in s or N * G in s)]
  assert not copies, copies


@pytest.mark.parametrize("scan", [True, False])
def test_packed_slots_equal_one_suffix_per_slot(scan):
  """Suffixes of lengths 5, 3, 7 (group 0) and 2, 6, 4 (group 1) packed two to a slot of width 8, each
  attending to its prefix and itself only: the log-probs and gradients of one suffix per slot."""
  cfg = tiny_config("llama", scan_layers=scan)
  graphdef, state = model_parts(cfg, seed=3)
  rng = np.random.default_rng(0)
  lengths, Ls = [(5, 3, 7), (2, 6, 4)], 8
  prefix = jnp.asarray(rng.integers(1, V, (2, 6)), jnp.int32)
  prefix_len = jnp.array([6, 4])
  suffixes = [[rng.integers(1, V, n) for n in group] for group in lengths]
  alone = np.zeros((2, 3, Ls), np.int32)
  for n, group in enumerate(suffixes):
    for g, x in enumerate(group):
      alone[n, g, :len(x)] = x
  slots = [[(0, 1), (2,)], [(0, 2), (1,)]]  # suffixes per slot, in order
  packed, segments, offsets = (np.zeros((2, 2, Ls), np.int32) for _ in range(3))
  where = {}  # (n, g) -> (slot, first column)
  for n, group_slots in enumerate(slots):
    for s, members in enumerate(group_slots):
      col = 0
      for k, g in enumerate(members):
        x = suffixes[n][g]
        packed[n, s, col:col + len(x)], segments[n, s, col:col + len(x)] = x, k
        offsets[n, s, col:col + len(x)] = np.arange(len(x))
        where[n, g] = (s, col)
        col += len(x)
      segments[n, s, col:], offsets[n, s, col:] = len(members), np.arange(Ls - col)  # padding: its own segment
  alone_mask = alone > 0
  packed_mask = packed > 0
  weights = np.random.default_rng(1).standard_normal((2, 3, Ls)).astype(np.float32)
  packed_weights = np.zeros((2, 2, Ls), np.float32)
  for (n, g), (s, col) in where.items():
    packed_weights[n, s, col:col + lengths[n][g]] = weights[n, g, :lengths[n][g]]

  def loss(state, suffix, mask, w, segments, offsets):
    _, lp = grouped_sequence_logprobs(graphdef, state, prefix, prefix_len, suffix, mask, chunk_size=8,
                                      suffix_segments=segments, suffix_offsets=offsets)
    return jnp.sum(w * lp), lp

  grad = jax.value_and_grad(loss, has_aux=True)
  (want_loss, want), want_g = run_jitted(grad, state, alone, alone_mask, weights, None, None)
  (got_loss, got), got_g = run_jitted(grad, state, packed, packed_mask, packed_weights, segments, offsets)
  for (n, g), (s, col) in where.items():
    np.testing.assert_allclose(got[n, s, col:col + lengths[n][g]], want[n, g, :lengths[n][g]], atol=1e-5)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5, atol=1e-5)
  assert_tree_close(got_g, want_g, rtol=1e-5, atol=1e-5)
