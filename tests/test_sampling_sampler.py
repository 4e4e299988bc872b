"""Sampler: prefill + while-loop decode against a cache-free reference, buckets, layouts, turns, truncation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from leap_jax.models import ModelConfig, Transformer
from leap_jax.sampling import Sampler, SamplingParams, bucket_length, row_keys, sample_logits, sequence_logprobs
from leap_jax.sampling.buckets import bucket

GREEDY = SamplingParams(temperature=0.0)
STOP = 3


@pytest.fixture(scope="session")
def tiny():
  cfg = ModelConfig(model_type="qwen2", vocab_size=48, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=1000.0, qkv_bias=True)
  graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  # Larger weights than the 0.02 init, so greedy paths are far from ties and vary with context.
  state = jax.tree.map(lambda x: x * 15.0 if x.ndim >= 2 else x, state)
  return cfg, graphdef, state


@pytest.fixture(scope="session")
def sampler(tiny):
  cfg, graphdef, _ = tiny
  return Sampler(graphdef, cfg, cache_len=64, stop_ids=(STOP,), pad_id=0)


def reference_greedy(graphdef, state, ids, steps, width=64):
  """Cache-free greedy decoding: one full forward pass over a fixed-width buffer per new token."""
  ids = list(ids)
  out = []
  for _ in range(steps):
    buffer = np.zeros((1, width), np.int32)
    buffer[0, :len(ids)] = ids
    token = int(_next_greedy(graphdef, state, jnp.asarray(buffer), len(ids)))
    out.append(token)
    ids.append(token)
    if token == STOP:
      break
  return out


@jax.jit(static_argnums=0)
def _next_greedy(graphdef, state, buffer, n):
  model = nnx.merge(graphdef, state)
  logits = model(buffer, jnp.arange(buffer.shape[1], dtype=jnp.int32)[None]).logits[0]
  return jnp.argmax(logits[n - 1])


PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29]]


def test_greedy_matches_cache_free_reference(tiny, sampler):
  cfg, graphdef, state = tiny
  del cfg
  _, outs = sampler.start(state, PROMPTS, 1, jax.random.key(0), max_new_tokens=12, sampling=GREEDY)
  for prompt, c in zip(PROMPTS, outs):
    want = reference_greedy(graphdef, state, prompt, 12)
    np.testing.assert_array_equal(c.tokens, want)
    assert c.finish_reason == ("stop" if want[-1] == STOP else "length")


def test_invariant_to_bucket_and_batch_layout(tiny, sampler):
  cfg, graphdef, state = tiny
  _, together = sampler.start(state, PROMPTS, 2, jax.random.key(0), max_new_tokens=12, sampling=GREEDY)
  wide = Sampler(graphdef, cfg, cache_len=64, stop_ids=(STOP,), min_bucket=32)
  _, alone = wide.start(state, [PROMPTS[1]], 1, jax.random.key(1), max_new_tokens=12, sampling=GREEDY)
  _, reordered = sampler.start(state, PROMPTS[::-1], 1, jax.random.key(2), max_new_tokens=12, sampling=GREEDY)
  np.testing.assert_array_equal(together[2].tokens, alone[0].tokens)
  np.testing.assert_array_equal(together[3].tokens, alone[0].tokens)
  np.testing.assert_array_equal(together[0].tokens, reordered[2].tokens)
  np.testing.assert_array_equal(together[4].tokens, reordered[0].tokens)


def test_sampled_rows_follow_their_keys_not_the_batch(tiny, sampler):
  _, _, state = tiny
  params = SamplingParams(temperature=1.0)
  key = jax.random.key(7)
  _, batch = sampler.start(state, PROMPTS[:2], 3, key, max_new_tokens=10, sampling=params)
  own = jax.vmap(lambda r: jax.random.fold_in(key, r))(jnp.arange(3, 6, dtype=jnp.uint32))
  _, alone = sampler.start(state, PROMPTS[1:2], 3, own, max_new_tokens=10, sampling=params)
  for a, b in zip(batch[3:], alone):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
  assert len({tuple(c.tokens) for c in batch[:3]}) > 1, "samples of one prompt should differ"


def test_sampler_logprobs_match_learner(tiny, sampler):
  _, graphdef, state = tiny
  params = SamplingParams(temperature=0.7, top_k=20, top_p=0.95)
  prompt = PROMPTS[0]
  _, outs = sampler.start(state, [prompt], 2, jax.random.key(3), max_new_tokens=12, sampling=params)
  for c in outs:
    tokens = np.array(prompt + c.tokens.tolist(), np.int32)[None]
    mask = np.zeros(tokens.shape, bool)
    mask[0, len(prompt):] = True
    learner = sequence_logprobs(graphdef, state, jnp.asarray(tokens), jnp.asarray(mask), temperature=0.7,
                                chunk_size=8)
    np.testing.assert_allclose(np.asarray(learner)[0, len(prompt):], c.logprobs, atol=2e-4)
    assert np.all(c.logprobs < 0)


def test_continue_equals_reencoding_history(tiny, sampler):
  _, graphdef, state = tiny
  st, first = sampler.start(state, PROMPTS[:2], 2, jax.random.key(0), max_new_tokens=6, sampling=GREEDY)
  feedback = {1: [30, 31, 32], 2: [33, 34]}
  st, second = sampler.continue_(state, st, list(feedback), list(feedback.values()), jax.random.key(1),
                                 max_new_tokens=7, sampling=GREEDY)
  for c in second:
    history = PROMPTS[c.row // 2] + first[c.row].tokens.tolist() + feedback[c.row]
    np.testing.assert_array_equal(c.tokens, reference_greedy(graphdef, state, history, 7))
    assert st.lengths[c.row] == len(history) + len(c.tokens)
  # Rows left out of the second call are intact and can be continued later.
  st, third = sampler.continue_(state, st, [3, 0], [[35], [36, 37]], jax.random.key(2), max_new_tokens=5,
                                sampling=GREEDY)
  row3 = PROMPTS[1] + first[3].tokens.tolist() + [35]
  row0 = PROMPTS[0] + first[0].tokens.tolist() + [36, 37]
  assert [c.row for c in third] == [3, 0]
  np.testing.assert_array_equal(third[0].tokens, reference_greedy(graphdef, state, row3, 5))
  np.testing.assert_array_equal(third[1].tokens, reference_greedy(graphdef, state, row0, 5))


def test_attention_window_smaller_than_the_cache(tiny, recwarn):
  """With S = 512, calls hold and read only the slots their positions reach, on the bucket ladder (32, then 48:
  the cache grows between turns, before the call that consumes it): same tokens as the reference."""
  cfg, graphdef, state = tiny
  big = Sampler(graphdef, cfg, cache_len=512, stop_ids=(STOP,), pad_id=0)
  assert big._window(32 + 12) == 48 and big._window(700) == 512
  st, first = big.start(state, PROMPTS, 1, jax.random.key(0), max_new_tokens=12, sampling=GREEDY)
  assert st.cache["k"].shape[3] == 32  # the longest prompt (17) + 12 new tokens
  for prompt, c in zip(PROMPTS, first):
    np.testing.assert_array_equal(c.tokens, reference_greedy(graphdef, state, prompt, 12))
  st, second = big.continue_(state, st, [2, 0], [[30, 31], [32]], jax.random.key(1), max_new_tokens=9,
                            sampling=GREEDY)
  for c, turn in zip(second, ([30, 31], [32])):
    history = PROMPTS[c.row] + first[c.row].tokens.tolist() + turn
    np.testing.assert_array_equal(c.tokens, reference_greedy(graphdef, state, history, 9))
  assert st.cache["k"].shape[3] == 48
  assert not [w for w in recwarn if "donated buffers were not usable" in str(w.message)]


def test_bucket_ladders_bound_padding():
  """The sampler's sizes run 16, 32, 48, 64, 80, ... (four per octave): a 775-token prompt pads to 896 (with
  powers of two, 1024). The learner's ladder has two per octave. Neither pads by more than its bound."""
  assert [bucket_length(n) for n in (1, 16, 17, 33, 65, 81, 700, 775, 900, 1025)] == [
      16, 16, 32, 48, 80, 96, 768, 896, 1024, 1280]
  assert [bucket_length(n, 1) for n in (1, 2, 3, 5, 7, 9, 11)] == [1, 2, 3, 5, 7, 10, 12]
  assert [bucket(n, 16) for n in (17, 33, 49, 65, 97, 700, 769)] == [32, 48, 64, 96, 128, 768, 1024]
  for n in range(65, 5000):
    assert n <= bucket_length(n) and 5 * (bucket_length(n) - n) < bucket_length(n)
    assert n <= bucket(n, 16) and 3 * (bucket(n, 16) - n) < bucket(n, 16)


def test_cache_overflow_truncates_rows_not_the_batch(tiny):
  cfg, graphdef, state = tiny
  small = Sampler(graphdef, cfg, cache_len=24, stop_ids=(), min_bucket=8)
  st, outs = small.start(state, [PROMPTS[0], PROMPTS[2], list(range(4, 30))], 1, jax.random.key(0),
                         max_new_tokens=10, sampling=GREEDY)
  assert [c.finish_reason for c in outs] == ["length", "truncated", "truncated"]
  assert [len(c.tokens) for c in outs] == [10, 24 - len(PROMPTS[2]), 0]
  np.testing.assert_array_equal(outs[1].tokens, reference_greedy(graphdef, state, PROMPTS[2], 7))
  st, more = small.continue_(state, st, [0, 1], [[40, 41], [42]], jax.random.key(1), max_new_tokens=10,
                             sampling=GREEDY)
  # Row 0 holds 15 tokens: 2 more leave room for 7; row 1 is full.
  assert [(c.finish_reason, len(c.tokens)) for c in more] == [("truncated", 7), ("truncated", 0)]
  assert st.lengths[0] == 24 and st.lengths[1] == 24


def test_stop_ids_end_rows_and_pad(tiny):
  cfg, graphdef, state = tiny
  _, probe = Sampler(graphdef, cfg, cache_len=64).start(state, [PROMPTS[1]], 1, jax.random.key(0),
                                                         max_new_tokens=8, sampling=GREEDY)
  stop = int(probe[0].tokens[4])
  first = probe[0].tokens.tolist().index(stop)
  _, outs = Sampler(graphdef, cfg, cache_len=64, stop_ids=(stop, 47)).start(
      state, [PROMPTS[1]], 1, jax.random.key(0), max_new_tokens=8, sampling=GREEDY)
  assert outs[0].finish_reason == "stop"
  np.testing.assert_array_equal(outs[0].tokens, probe[0].tokens[:first + 1])


def test_prompt_lengths_in_one_bucket_share_a_compile(tiny):
  """A call compiles once per bucket of its prompt length and of the slots it reaches (prompt + new tokens)."""
  cfg, graphdef, state = tiny
  s = Sampler(graphdef, cfg, cache_len=64)
  for n in (3, 9, 12):
    s.start(state, [list(range(4, 4 + n))], 2, jax.random.key(n), max_new_tokens=4, sampling=GREEDY)
  assert s._start._cache_size() == 1
  s.start(state, [list(range(4, 21))], 2, jax.random.key(0), max_new_tokens=4, sampling=GREEDY)
  assert s._start._cache_size() == 2


def test_sample_logits_truncation_rules():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 4000))
  keys = jax.random.split(jax.random.key(0), 4000)
  sample = jax.jit(sample_logits, static_argnums=3)
  tokens, logprobs = sample(logits, keys, jnp.int32(0), SamplingParams(top_k=2))
  assert set(np.unique(tokens).tolist()) == {0, 1}
  np.testing.assert_allclose(logprobs, np.log([0.5, 0.3, 0.15, 0.05])[np.asarray(tokens)], rtol=1e-5)
  tokens, _ = sample(logits, keys, jnp.int32(0), SamplingParams(top_p=0.85))
  counts = np.bincount(np.asarray(tokens), minlength=4) / 4000
  np.testing.assert_allclose(counts, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0], atol=0.03)
  tokens, logprobs = sample(logits, keys, jnp.int32(0), SamplingParams(temperature=0.0))
  assert np.all(np.asarray(tokens) == 0)
  np.testing.assert_allclose(logprobs, np.log(0.5), rtol=1e-5)


def test_row_keys_and_bad_inputs(tiny, sampler):
  _, _, state = tiny
  a = row_keys(0, 1, [0, 1, 2], 0)
  b = row_keys(0, 1, [0, 1, 2], 1)
  assert a.shape == (3,)
  assert not np.array_equal(jax.random.key_data(a), jax.random.key_data(b))
  with pytest.raises(ValueError, match="empty"):
    sampler.start(state, [[]], 1, jax.random.key(0), max_new_tokens=4)
  with pytest.raises(ValueError, match="row keys"):
    sampler.start(state, [[5]], 2, jax.random.split(jax.random.key(0), 3), max_new_tokens=4)
  with pytest.raises(ValueError, match="top_p"):
    SamplingParams(top_p=0.0)
  st, _ = sampler.start(state, [[5, 6]], 2, jax.random.key(0), max_new_tokens=2, sampling=GREEDY)
  with pytest.raises(ValueError, match="distinct"):
    sampler.continue_(state, st, [0, 0], [[5], [6]], jax.random.key(0), max_new_tokens=2)
  with pytest.raises(ValueError, match=r"rows must be in \[0, 2\)"):
    sampler.continue_(state, st, [2], [[5]], jax.random.key(0), max_new_tokens=2)
