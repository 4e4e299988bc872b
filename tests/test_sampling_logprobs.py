"""Learner log-probs: chunked == unchunked == direct log-softmax, gradients too, no [B, L, V] logits."""
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from leap_jax.models import ModelConfig, Transformer
from leap_jax.sampling import sequence_logprobs, token_logprobs

B, L, V = 2, 11, 40


@pytest.fixture(scope="session")
def model_parts():
  cfg = ModelConfig(model_type="llama", vocab_size=V, hidden_size=24, intermediate_size=48, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=6, tie_word_embeddings=False)
  graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(1)))
  state = jax.tree.map(lambda x: x * 10.0 if x.ndim >= 2 else x, state)
  tokens = jax.random.randint(jax.random.key(0), (B, L), 0, V, jnp.int32)
  mask = jnp.asarray(np.arange(L)[None, :] < np.array([[L], [7]]))
  return graphdef, state, tokens, mask


def test_chunked_equals_unchunked_and_direct(model_parts):
  graphdef, state, tokens, mask = model_parts
  model = nnx.merge(graphdef, state)
  logits = model(tokens, jnp.broadcast_to(jnp.arange(L), (B, L))).logits
  direct = jax.nn.log_softmax(logits[:, :-1] / 0.6, axis=-1)
  direct = jnp.take_along_axis(direct, tokens[:, 1:, None], axis=-1)[..., 0]
  want = np.where(np.asarray(mask)[:, 1:], np.asarray(direct), 0.0)
  for chunk in (None, 3, 4, 64):
    got = np.asarray(sequence_logprobs(graphdef, state, tokens, mask, temperature=0.6, chunk_size=chunk))
    assert got.shape == (B, L)
    np.testing.assert_array_equal(got[:, 0], 0.0)
    np.testing.assert_allclose(got[:, 1:], want, atol=1e-5)
  assert np.all(got[1, 7:] == 0.0) and np.all(got[1, 1:7] < 0)


def test_gradients_agree_between_chunked_and_unchunked(model_parts):
  graphdef, state, tokens, mask = model_parts

  def loss(s, chunk):
    return jnp.sum(sequence_logprobs(graphdef, s, tokens, mask, chunk_size=chunk))

  grad = jax.jit(jax.grad(loss), static_argnums=1)
  full, chunked = grad(state, None), grad(state, 4)
  norm = sum(float(jnp.sum(g**2)) for g in jax.tree.leaves(full))
  assert norm > 0
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4), full, chunked)


def _shapes(jaxpr, out):
  for eqn in jaxpr.eqns:
    out.update(tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      _shapes(sub, out)
  return out


def test_backward_never_holds_full_logits(model_parts):
  graphdef, state, tokens, mask = model_parts

  def loss(s, chunk):
    return jnp.sum(sequence_logprobs(graphdef, s, tokens, mask, chunk_size=chunk))

  chunked = _shapes(jax.make_jaxpr(jax.grad(loss), static_argnums=1)(state, 4).jaxpr, set())
  unchunked = _shapes(jax.make_jaxpr(jax.grad(loss), static_argnums=1)(state, None).jaxpr, set())
  assert (B, L, V) in unchunked
  assert not any(len(s) >= 3 and s[-1] == V and s[-2] > 4 for s in chunked), sorted(chunked)


def test_token_logprobs_and_errors(model_parts):
  graphdef, state, tokens, mask = model_parts
  logits = jnp.log(jnp.array([[0.25, 0.75]]))
  np.testing.assert_allclose(token_logprobs(logits, jnp.array([1])), np.log([0.75]), rtol=1e-6)
  np.testing.assert_allclose(token_logprobs(logits, jnp.array([1]), 0.0), np.log([0.75]), rtol=1e-6)
  with pytest.raises(ValueError, match="temperature"):
    token_logprobs(logits, jnp.array([1]), -1.0)
  with pytest.raises(ValueError, match=r"\[B, L\]"):
    sequence_logprobs(graphdef, state, tokens, mask[:, :3])
  with pytest.raises(ValueError, match="chunk_size"):
    sequence_logprobs(graphdef, state, tokens, mask, chunk_size=0)
