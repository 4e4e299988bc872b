"""Tiny-config tests of the NNX decoder: cache semantics, layer stacking, remat, hidden states, sharding."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from leap_jax.models import (ModelConfig, Transformer, batch_spec, cache_spec, init_cache, make_mesh,
                             model_from_flat, model_to_flat, shard_model)


def tiny_config(**overrides) -> ModelConfig:
  base = dict(model_type="llama", vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=3,
              num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=500.0)
  base.update(overrides)
  return ModelConfig(**base)


def forward(model, tokens, positions, cache=None, **kwargs):
  graphdef, state = nnx.split(model)

  @jax.jit
  def run(state, tokens, positions, cache):
    return nnx.merge(graphdef, state)(tokens, positions, cache, **kwargs)

  return run(state, tokens, positions, cache)


@pytest.fixture(scope="module")
def qwen_model():
  cfg = tiny_config(model_type="qwen2", qkv_bias=True, tie_word_embeddings=True)
  model = Transformer(cfg, rngs=nnx.Rngs(1))
  # Non-trivial biases and norm scales, so that every parameter shows up in the outputs.
  flat = {k: np.asarray(v) for k, v in model_to_flat(model).items()}
  rng = np.random.default_rng(0)
  for name in flat:
    if name.endswith("_bias"):
      flat[name] = 0.1 * rng.standard_normal(flat[name].shape).astype(np.float32)
    if name.endswith("scale"):
      flat[name] = 1.0 + 0.1 * rng.standard_normal(flat[name].shape).astype(np.float32)
  return model_from_flat(cfg, flat)


def random_tokens(seed, shape, vocab=96):
  return jnp.asarray(np.random.default_rng(seed).integers(0, vocab, shape), jnp.int32)


def test_output_shapes_and_cache_layout(qwen_model):
  cfg = qwen_model.config
  cache = init_cache(cfg, batch=2, max_len=16)
  assert cache["k"].shape == (3, 2, 2, 16, 8) and cache["v"].dtype == jnp.float32
  tokens = random_tokens(0, (2, 5))
  positions = jnp.broadcast_to(jnp.arange(5, dtype=jnp.int32), (2, 5))
  out = forward(qwen_model, tokens, positions, cache, hidden_layers=(0, 3, -1))
  assert out.logits.shape == (2, 5, 96) and out.logits.dtype == jnp.float32
  assert out.hidden.shape == (3, 2, 5, 32) and out.final_hidden.shape == (2, 5, 32)
  assert out.cache["k"].shape == cache["k"].shape
  # Slots 0..4 written, the rest untouched.
  assert np.all(np.asarray(out.cache["k"])[:, :, :, 5:] == 0)
  assert np.all(np.abs(np.asarray(out.cache["k"])[:, :, :, :5]).sum(-1) > 0)
  no_logits = forward(qwen_model, tokens, positions, return_logits=False)
  assert no_logits.logits is None and no_logits.cache is None and no_logits.hidden is None


def test_hidden_states_follow_hf_indexing(qwen_model):
  tokens = random_tokens(1, (2, 6))
  positions = jnp.broadcast_to(jnp.arange(6, dtype=jnp.int32), (2, 6))
  out = forward(qwen_model, tokens, positions, hidden_layers=(0, 1, 3))
  embedded = np.asarray(qwen_model.embedding[...])[np.asarray(tokens)]
  np.testing.assert_allclose(out.hidden[0], embedded, rtol=0, atol=0)
  assert not np.allclose(out.hidden[1], out.hidden[0])
  np.testing.assert_allclose(qwen_model.final_norm(out.hidden[2]), out.final_hidden, atol=1e-6)
  np.testing.assert_allclose(qwen_model.logits_from_hidden(out.final_hidden), out.logits, atol=1e-5)
  with pytest.raises(ValueError, match="hidden layer index 4"):
    qwen_model(tokens, positions, hidden_layers=(4,))


def test_tied_output_layer_uses_embedding(qwen_model):
  assert not hasattr(qwen_model, "lm_head")
  h = jax.random.normal(jax.random.key(0), (3, 32))
  np.testing.assert_allclose(qwen_model.logits_from_hidden(h), h @ qwen_model.embedding[...].T, atol=1e-5)


def test_prefill_then_decode_matches_full_forward(qwen_model):
  """Right-padded prompts of different lengths, then per-row one-token decode steps."""
  B, T = 3, 9
  tokens = random_tokens(2, (B, T))
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  full = forward(qwen_model, tokens, positions).logits
  lengths = np.array([4, 2, 6])
  prompt_len = 6
  padded = np.where(np.arange(prompt_len)[None] < lengths[:, None], np.asarray(tokens)[:, :prompt_len], 0)
  cache = init_cache(qwen_model.config, B, max_len=12)
  out = forward(qwen_model, jnp.asarray(padded, jnp.int32), positions[:, :prompt_len], cache)
  for b in range(B):
    np.testing.assert_allclose(out.logits[b, :lengths[b]], full[b, :lengths[b]], atol=1e-5)
  cache, pos = out.cache, lengths.copy()
  for _ in range(3):
    step_tokens = np.asarray(tokens)[np.arange(B), pos][:, None]
    step = forward(qwen_model, jnp.asarray(step_tokens, jnp.int32), jnp.asarray(pos[:, None], jnp.int32), cache)
    np.testing.assert_allclose(step.logits[:, 0], np.asarray(full)[np.arange(B), pos], atol=1e-5)
    cache, pos = step.cache, pos + 1


def test_appending_a_turn_at_an_offset(qwen_model):
  B, T, split = 2, 10, np.array([3, 5])
  tokens = random_tokens(3, (B, T))
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  full = np.asarray(forward(qwen_model, tokens, positions).logits)
  cache = init_cache(qwen_model.config, B, max_len=T)
  # First chunk: 5 tokens per row, of which only the first split[b] are kept (the rest are stale pad).
  first = np.where(np.arange(5)[None] < split[:, None], np.asarray(tokens)[:, :5], 7)
  cache = forward(qwen_model, jnp.asarray(first, jnp.int32), positions[:, :5], cache).cache
  # Second chunk starts at each row's own offset; row 0 overwrites its stale slots 3..4.
  L = 4
  chunk_pos = split[:, None] + np.arange(L)[None]
  chunk = np.asarray(tokens)[np.arange(B)[:, None], chunk_pos]
  out = forward(qwen_model, jnp.asarray(chunk, jnp.int32), jnp.asarray(chunk_pos, jnp.int32), cache)
  np.testing.assert_allclose(out.logits, full[np.arange(B)[:, None], chunk_pos], atol=1e-5)


def test_positions_beyond_cache_are_dropped(qwen_model):
  cache = init_cache(qwen_model.config, 1, max_len=4)
  tokens = random_tokens(4, (1, 3))
  out = forward(qwen_model, tokens, jnp.asarray([[2, 3, 4]], jnp.int32), cache)
  k = np.asarray(out.cache["k"])
  assert np.all(k[:, :, :, :2] == 0) and np.all(np.abs(k[:, :, :, 2:]).sum(-1) > 0)


def test_scanned_and_unscanned_layers_agree(qwen_model):
  flat = model_to_flat(qwen_model)
  loop_model = model_from_flat(qwen_model.config.replace(scan_layers=False), flat)
  assert isinstance(loop_model.layers, nnx.List)
  tokens = random_tokens(5, (2, 7))
  positions = jnp.asarray(np.stack([np.arange(7), np.arange(3, 10)]), jnp.int32)
  a = forward(qwen_model, tokens, positions, hidden_layers=(1, 2))
  b = forward(loop_model, tokens, positions, hidden_layers=(1, 2))
  np.testing.assert_allclose(a.logits, b.logits, atol=1e-5)
  np.testing.assert_allclose(a.hidden, b.hidden, atol=1e-5)


@pytest.mark.parametrize("scan_layers", [True, False])
def test_remat_gives_equal_gradients(qwen_model, scan_layers):
  cfg = qwen_model.config.replace(scan_layers=scan_layers)
  flat = model_to_flat(qwen_model)
  tokens = random_tokens(6, (2, 6))
  positions = jnp.broadcast_to(jnp.arange(6, dtype=jnp.int32), (2, 6))

  def grads(remat):
    graphdef, state = nnx.split(model_from_flat(cfg.replace(remat=remat), flat))

    def loss(state):
      logits = nnx.merge(graphdef, state)(tokens, positions).logits
      return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1))

    return jax.jit(jax.grad(loss))(state)

  plain, remat = grads("none"), grads("full")
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), plain, remat)
  assert float(jnp.abs(plain["layers"]["attn"]["q_bias"][...] if scan_layers
                       else plain["layers"][0]["attn"]["q_bias"][...]).sum()) > 0


def test_sharded_forward_matches_single_device(qwen_model):
  assert jax.device_count() == 8
  cfg = tiny_config(num_heads=8, num_kv_heads=4, intermediate_size=64)
  model = Transformer(cfg, rngs=nnx.Rngs(2))
  tokens = random_tokens(7, (4, 8))
  positions = jnp.broadcast_to(jnp.arange(8, dtype=jnp.int32), (4, 8))
  expected = forward(model, tokens, positions).logits
  mesh = make_mesh(data=2, fsdp=2, tensor=2)
  sharded = shard_model(Transformer(cfg, rngs=nnx.Rngs(2)), mesh)
  q = sharded.layers.attn.q_proj[...]
  assert q.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
  assert len(q.addressable_shards) == 8 and q.addressable_shards[0].data.shape == (3, 16, 32)
  put = lambda x: jax.device_put(x, NamedSharding(mesh, batch_spec(mesh, 4)))
  got = forward(sharded, put(tokens), put(positions)).logits
  np.testing.assert_allclose(got, expected, atol=1e-5)
  # Prefill into a cache sharded over batch and KV heads, then one decode step.
  cache = jax.device_put(init_cache(cfg, 4, 12), NamedSharding(mesh, cache_spec(cfg, mesh, 4)))
  assert cache["k"].sharding.spec == jax.sharding.PartitionSpec(None, ("data", "fsdp"), "tensor", None, None)
  cache = forward(sharded, put(tokens[:, :7]), put(positions[:, :7]), cache).cache
  step = forward(sharded, put(tokens[:, 7:]), put(positions[:, 7:]), cache).logits
  np.testing.assert_allclose(step[:, 0], expected[:, 7], atol=1e-5)


def test_single_layer_round_trip():
  cfg = tiny_config(num_layers=1)
  model = Transformer(cfg, rngs=nnx.Rngs(3))
  flat = model_to_flat(model)
  assert flat["layers.0.attn.q_proj"].shape == (32, 32)
  again = model_from_flat(cfg, {k: np.asarray(v) for k, v in flat.items()})
  jax.tree.map(np.testing.assert_array_equal, nnx.state(model), nnx.state(again))


def test_make_mesh_sizes():
  assert dict(make_mesh(fsdp=-1, tensor=2).shape) == {"data": 1, "fsdp": 4, "tensor": 2}
  with pytest.raises(ValueError, match="needs 6 devices"):
    make_mesh(data=3, fsdp=2, tensor=1)


def test_bad_inputs_are_rejected(qwen_model):
  tokens = random_tokens(8, (2, 4))
  positions = jnp.broadcast_to(jnp.arange(4, dtype=jnp.int32), (2, 4))
  with pytest.raises(ValueError, match="positions shape"):
    qwen_model(tokens, positions[:, :3])
  with pytest.raises(ValueError, match="cache\\['k'\\] shape"):
    qwen_model(tokens, positions, init_cache(qwen_model.config, batch=3, max_len=8))
  with pytest.raises(ValueError, match="num_kv_heads"):
    tiny_config(num_kv_heads=3)
  with pytest.raises(ValueError, match="missing"):
    model_from_flat(qwen_model.config, {})


def test_bfloat16_compute_keeps_f32_logits(qwen_model):
  flat = model_to_flat(qwen_model)
  model = model_from_flat(qwen_model.config.replace(dtype="bfloat16", param_dtype="bfloat16"), flat)
  assert model.layers.attn.q_proj[...].dtype == jnp.bfloat16
  tokens = random_tokens(9, (2, 5))
  positions = jnp.broadcast_to(jnp.arange(5, dtype=jnp.int32), (2, 5))
  out = forward(model, tokens, positions, init_cache(model.config, 2, 8))
  assert out.final_hidden.dtype == jnp.bfloat16 and out.cache["k"].dtype == jnp.bfloat16
  assert out.logits.dtype == jnp.float32
  np.testing.assert_allclose(out.logits, forward(qwen_model, tokens, positions).logits, atol=0.05)
