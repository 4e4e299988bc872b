"""Learner: objective terms, aggregation, gradient accumulation, TIS, reference KL, sharded steps."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from configs import common
from leap_jax.models import ModelConfig, Transformer
from leap_jax.models import sharding as model_sharding
from leap_jax.train import learner as learner_lib
from leap_jax.train import objectives, optim
from leap_jax.train.batch import batch_from_numpy
from leap_jax.train.config import from_mapping

TINY = dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
B, L, PROMPT = 16, 16, 6


@pytest.fixture(scope="module")
def tiny():
  model = Transformer(ModelConfig.from_hf_config(TINY), rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  return graphdef, params, learner_lib.model_logprob_fn(graphdef, chunk_size=8)


@pytest.fixture(scope="module")
def on_policy_batch(tiny):
  """Random episodes whose sampler log-probs are the model's own (an exactly on-policy batch)."""
  _, params, logprob_fn = tiny
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, TINY["vocab_size"], (B, L))
  policy_mask = np.zeros((B, L), bool)
  policy_mask[:, PROMPT:] = True
  policy_mask[0, 12:] = False  # a shorter episode
  advantages = np.repeat(rng.normal(size=(B, 1)), L, axis=1)
  old = np.asarray(jax.jit(logprob_fn)(params, jnp.asarray(tokens, jnp.int32), jnp.ones((B, L), bool)))
  return batch_from_numpy(tokens, policy_mask, advantages, old)


def _configs(**learner_overrides):
  """(OptimConfig, LearnerConfig) of configs/common.py's sections with lr 1e-3 and the overrides."""
  optim_cfg = common.optim()
  optim_cfg.learning_rate = 1e-3
  learner_cfg = common.learner()
  for k, v in learner_overrides.items():
    if k in optim_cfg:
      optim_cfg[k] = v
    else:
      learner_cfg[k] = v
  typed = from_mapping(optim.OptimConfig, optim_cfg.to_dict())
  return typed, from_mapping(learner_lib.LearnerConfig, learner_cfg.to_dict(), grad_accum_steps=typed.grad_accum_steps)


_LEARNERS = {}


def _learner(logprob_fn, mesh=None, optimizer=None, **overrides):
  """Learners are cached per configuration so that tests sharing one reuse its compiled step."""
  key = (logprob_fn, mesh, optimizer, tuple(sorted(overrides.items())))
  if key not in _LEARNERS:
    _LEARNERS[key] = _new_learner(logprob_fn, mesh, optimizer, **overrides)
  return _LEARNERS[key]


def _new_learner(logprob_fn, mesh=None, optimizer=None, **overrides):
  optim_cfg, learner_cfg = _configs(**overrides)
  optimizer = optim.make_optimizer(optim_cfg) if optimizer is None else optimizer
  return learner_lib.Learner(logprob_fn, optimizer,
                             learner_cfg, mesh=mesh,
                             lr_schedule=optim.learning_rate_schedule(optim_cfg))


def _run(tiny, batch, steps, mesh=None, optimizer=None, **overrides):
  _, params, logprob_fn = tiny
  learner = _learner(logprob_fn, mesh, optimizer, **overrides)
  specs = None if mesh is None else model_sharding.partition_specs(params, mesh)
  state = learner.init_state(params, seed=0, param_specs=specs)
  history = []
  for _ in range(steps):
    state, metrics = learner.step(state, batch)
    history.append(metrics)
  return state, history


def _flat(params):
  return [np.asarray(x) for x in jax.tree.leaves(params)]


def test_clipped_surrogate_matches_formula_and_clips_asymmetrically():
  logp = jnp.log(jnp.array([[0.5, 1.5, 1.1, 0.7]]))
  adv = jnp.array([[-1.0, 2.0, 1.0, 1.0]])
  loss, clipped = objectives.clipped_surrogate(logp, jnp.zeros_like(logp), adv, eps_low=0.2, eps_high=0.28)
  ratio = np.array([0.5, 1.5, 1.1, 0.7])
  expected = -np.minimum(ratio * adv[0], np.clip(ratio, 0.8, 1.28) * adv[0])
  np.testing.assert_allclose(loss[0], expected, rtol=1e-6)
  np.testing.assert_array_equal(clipped[0], [True, True, False, False])


def test_k3_is_nonnegative_and_zero_on_equal_policies():
  rng = np.random.default_rng(1)
  a, b = jnp.asarray(rng.normal(size=(3, 5))), jnp.asarray(rng.normal(size=(3, 5)))
  assert float(objectives.k3_kl(a, b).min()) >= 0.0
  np.testing.assert_allclose(objectives.k3_kl(a, a), 0.0, atol=1e-7)
  np.testing.assert_allclose(objectives.approx_kl(a, a), 0.0, atol=1e-7)


def test_aggregation_divisors():
  mask = jnp.array([[1, 1, 0, 0], [1, 1, 1, 1]], bool)
  values = jnp.array([[1.0, 3.0, 9.0, 9.0], [2.0, 2.0, 2.0, 6.0]])
  agg = lambda mode, n=None: float(jnp.sum(mask * values / objectives.aggregation_denominators(mask, mode, n)))
  assert agg("token_mean") == pytest.approx((1 + 3 + 2 + 2 + 2 + 6) / 6)
  assert agg("sequence_mean") == pytest.approx(((1 + 3) / 2 + (2 + 2 + 2 + 6) / 4) / 2)
  assert agg("constant") == pytest.approx(16 / (2 * 4))
  assert agg("constant", 8) == pytest.approx(16 / (2 * 8))
  with pytest.raises(ValueError, match="unknown loss aggregation"):
    objectives.aggregation_denominators(mask, "mean")
  # The same two episodes packed into one row (a shared-prefix slot), with one padding column.
  packed = jnp.array([[1, 1, 1, 1, 1, 1, 0]], bool)
  packed_values = jnp.array([[1.0, 3.0, 2.0, 2.0, 2.0, 6.0, 9.0]])
  episodes = jnp.array([[4, 4, 0, 0, 0, 0, -1]])
  for mode, n in (("token_mean", None), ("sequence_mean", None), ("constant", 8)):
    d = objectives.aggregation_denominators(packed, mode, n, episodes=episodes)
    assert float(jnp.sum(packed * packed_values / d)) == pytest.approx(agg(mode, n)), mode


def test_truncated_is_weight_caps():
  w = objectives.truncated_is_weight(jnp.array([0.0, 0.0, 0.0]), jnp.log(jnp.array([2.0, 1.0, 0.1])), cap=2.0)
  np.testing.assert_allclose(w, [0.5, 1.0, 2.0], rtol=1e-6)
  with pytest.raises(ValueError, match="cap must be > 0"):
    objectives.truncated_is_weight(jnp.zeros(1), jnp.zeros(1), cap=0.0)


def test_schedule_warmup_cosine_and_decay_mask():
  lr = optim.learning_rate_schedule(optim.OptimConfig(learning_rate=1.0, warmup_steps=2, decay_steps=6,
                                                      end_ratio=0.1))
  np.testing.assert_allclose([float(lr(n)) for n in (0, 1, 2, 4, 6, 9)],
                             [0.5, 1.0, 1.0, 0.1 + 0.9 * 0.5, 0.1, 0.1], rtol=1e-6)
  with pytest.raises(ValueError, match="decay_steps"):
    optim.OptimConfig(learning_rate=1.0, warmup_steps=2, decay_steps=2)
  cfg = optim.OptimConfig(learning_rate=0.1, weight_decay=0.5)
  tx = optim.make_optimizer(cfg)
  params = {"w": jnp.ones((2, 2)), "scale": jnp.ones((2,))}
  updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
  new = optax.apply_updates(params, updates)
  np.testing.assert_allclose(new["w"], 1.0 - 0.1 * 0.5)  # decoupled decay on matrices
  np.testing.assert_allclose(new["scale"], 1.0)  # none on vectors


def test_first_update_on_policy_loss_is_minus_mean_advantage(tiny, on_policy_batch):
  """On-policy batch, one update: ratio = 1, nothing clipped, loss = -token-mean advantage, gap 0."""
  _, history = _run(tiny, on_policy_batch, steps=1)
  m = history[0]
  mask = on_policy_batch.policy_mask
  assert m["loss"] == pytest.approx(-on_policy_batch.advantages[mask].mean(), rel=1e-5)
  assert m["clip_fraction"] == 0.0
  assert abs(m["logprob_gap"]) < 1e-5 and m["logprob_gap_abs"] < 1e-5
  assert m["approx_kl"] < 1e-9
  assert m["policy_tokens"] == mask.sum()
  assert m["entropy_proxy"] == pytest.approx(-on_policy_batch.old_logprobs[mask].mean(), rel=1e-5)
  assert m["grad_norm"] > 0


def test_updates_follow_the_advantage_and_reuse_makes_the_clip_bite(tiny, on_policy_batch, two_step_runs):
  """mu=2 passes over 2 minibatches: later updates reuse samples, so some ratios leave the clip range."""
  _, _, logprob_fn = tiny
  state, history = two_step_runs["single"]
  assert history[0]["approx_kl"] > 0
  assert history[0]["clip_fraction"] > 0 and history[1]["clip_fraction"] > 0
  assert history[1]["logprob_gap_abs"] > history[0]["logprob_gap_abs"]
  new_lp = np.asarray(logprob_fn(state.params, jnp.asarray(on_policy_batch.tokens), jnp.ones((B, L), bool)))
  delta = ((new_lp - on_policy_batch.old_logprobs) * on_policy_batch.policy_mask).sum(1)
  sign = np.sign(on_policy_batch.advantages[:, 0])
  assert np.mean(np.sign(delta) == sign) >= 0.75, (delta, sign)


def test_gradient_accumulation_equals_one_big_minibatch(tiny, on_policy_batch):
  """Plain SGD, so the parameter change is the gradient itself (Adam would magnify float noise)."""
  _, params, _ = tiny
  one, m_one = _run(tiny, on_policy_batch, steps=1, optimizer=optax.sgd(1.0), aggregation="sequence_mean")
  acc, m_acc = _run(tiny, on_policy_batch, steps=1, optimizer=optax.sgd(1.0), aggregation="sequence_mean",
                    grad_accum_steps=4)
  assert m_one[0]["loss"] == pytest.approx(m_acc[0]["loss"], rel=1e-5)
  assert m_one[0]["grad_norm"] == pytest.approx(m_acc[0]["grad_norm"], rel=1e-5)
  for a, b, p in zip(_flat(one.params), _flat(acc.params), _flat(params)):
    np.testing.assert_allclose(a - p, b - p, rtol=1e-4, atol=2e-7)  # float32 spacing near 1


def test_truncated_importance_sampling_and_reference_kl(tiny, on_policy_batch):
  """Sampler log-probs 1 nat below the learner's: weight e > cap, so every token is capped. The frozen
  reference is the initial policy, so at the only update KL = 0 and the loss is the weighted surrogate."""
  _, params, logprob_fn = tiny
  shifted = on_policy_batch.replace(old_logprobs=on_policy_batch.old_logprobs - 1.0)
  _, plain = _run(tiny, shifted, steps=1)
  learner = _learner(logprob_fn, tis_cap=2.0, kl_beta=0.1)
  _, tis = learner.step(learner.init_state(params, seed=0), shifted, ref_params=params)
  assert plain[0]["logprob_gap"] == pytest.approx(1.0, abs=1e-4)
  assert plain[0]["clip_fraction"] > 0.3  # ratio e vs the sampler: positive-advantage tokens clipped
  assert tis["tis_weight"] == pytest.approx(2.0, rel=1e-5)
  assert tis["tis_capped_fraction"] == 1.0
  assert tis["clip_fraction"] == 0.0  # ratio against the learner's own batch-start log-probs
  assert 0.0 <= tis["kl_ref"] < 1e-9
  expected = -2.0 * on_policy_batch.advantages[on_policy_batch.policy_mask].mean()
  assert tis["loss"] == pytest.approx(expected, rel=1e-4)
  with pytest.raises(ValueError, match="ref_logprobs or ref_params"):
    learner.step(learner.init_state(params, seed=0), shifted)


def test_reference_forward_only_when_kl_beta_positive(tiny, on_policy_batch):
  """Counts log-prob forwards while tracing the step: the reference one exists only when kl_beta > 0."""
  _, params, logprob_fn = tiny
  calls = []

  def counting(p, tokens, mask):
    calls.append(1)
    return logprob_fn(p, tokens, mask)

  batch = jax.tree.map(jnp.asarray, on_policy_batch)
  for beta, expected_calls in ((0.0, 1), (0.1, 2)):
    calls.clear()
    learner = _new_learner(counting, kl_beta=beta)
    jax.eval_shape(learner._train_step, learner.init_state(params, seed=0), batch, params)  # traces only
    assert len(calls) == expected_calls
  calls.clear()
  learner = _new_learner(counting, kl_beta=0.1)
  jax.eval_shape(learner._train_step, learner.init_state(params, seed=0),
                 batch.replace(ref_logprobs=batch.old_logprobs), params)
  assert len(calls) == 1  # precomputed reference log-probs: no reference forward


def test_kl_term_adds_beta_times_the_logged_kl_to_a_frozen_bf16_reference(tiny, on_policy_batch):
  """The reference is another random init (so KL > 0), cast to bf16: the loss with kl_beta = 0.05 is the loss
  with kl_beta = 0 plus 0.05 x the logged KL. Under a mesh the reference is sharded like the policy."""
  _, params, logprob_fn = tiny
  other = nnx.state(Transformer(ModelConfig.from_hf_config(TINY), rngs=nnx.Rngs(1)))
  _, plain = _run(tiny, on_policy_batch, steps=1)
  learner = _learner(logprob_fn, kl_beta=0.05)
  ref = learner.reference_params(other, dtype="bfloat16")
  assert {x.dtype for x in jax.tree.leaves(ref)} == {jnp.dtype(jnp.bfloat16)}
  _, with_kl = learner.step(learner.init_state(params, seed=0), on_policy_batch, ref)
  assert with_kl["kl_ref"] > 1e-3 and with_kl["pg_loss"] == pytest.approx(plain[0]["pg_loss"], rel=1e-5)
  assert with_kl["loss"] - plain[0]["loss"] == pytest.approx(0.05 * with_kl["kl_ref"], rel=1e-3)
  mesh = model_sharding.make_mesh(2, 2, 2)
  specs = model_sharding.partition_specs(params, mesh)
  sharded = _new_learner(logprob_fn, mesh, kl_beta=0.05)
  policy = sharded.init_state(params, 0, specs).params
  for r, p in zip(jax.tree.leaves(sharded.reference_params(params, specs)), jax.tree.leaves(policy), strict=True):
    assert r.sharding == p.sharding and r.dtype == p.dtype
  assert any(not x.sharding.is_fully_replicated for x in jax.tree.leaves(policy))


def test_bad_batches_are_named(tiny, on_policy_batch):
  _, params, logprob_fn = tiny
  with pytest.raises(ValueError, match="advantages"):
    batch_from_numpy(np.zeros((2, 4)), np.ones((2, 4)), np.zeros((2, 3)), np.zeros((2, 4)))
  learner = _learner(logprob_fn, num_minibatches=3)
  with pytest.raises(ValueError, match="num_minibatches=3"):
    learner.step(learner.init_state(params, seed=0), on_policy_batch)
  learner = _learner(logprob_fn, mesh=model_sharding.make_mesh(2, 2, 2), num_minibatches=8)
  with pytest.raises(ValueError, match="does not split over the 4 data x fsdp shards"):
    learner.step(learner.init_state(params, seed=0), on_policy_batch)
  with pytest.raises(ValueError, match="aggregation"):
    learner_lib.LearnerConfig(aggregation="sum")


@pytest.fixture(scope="module")
def two_step_runs(tiny, on_policy_batch):
  """Two steps (mu=2, 2 minibatches, accumulation 2, TIS, tight clip) on 1 device and on a 2x2x2 mesh of 8 devices."""
  overrides = dict(mu=2, num_minibatches=2, grad_accum_steps=2, tis_cap=2.0, eps_low=0.01, eps_high=0.015)
  return {
      "single": _run(tiny, on_policy_batch, steps=2, **overrides),
      "sharded": _run(tiny, on_policy_batch, steps=2, mesh=model_sharding.make_mesh(2, 2, 2), **overrides),
  }


def test_sharded_steps_match_single_device(two_step_runs):
  single, single_hist = two_step_runs["single"]
  sharded, sharded_hist = two_step_runs["sharded"]
  assert any(len(x.sharding.device_set) == 8 and not x.sharding.is_fully_replicated
             for x in jax.tree.leaves(sharded.params))
  for a, b in zip(_flat(sharded.params), _flat(single.params)):
    # atol: Adam scales float noise in near-zero gradient entries up to ~lr * 1e-3.
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  for key in ("loss", "clip_fraction", "grad_norm", "logprob_gap"):
    assert sharded_hist[1][key] == pytest.approx(single_hist[1][key], rel=1e-4, abs=1e-6)
  assert int(sharded.step) == 2


def test_bfloat16_params_keep_their_dtype(on_policy_batch):
  """The GPU configuration: bf16 parameters and compute, f32 gradient accumulation."""
  cfg = ModelConfig.from_hf_config(TINY, dtype="bfloat16", param_dtype="bfloat16")
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  learner = _new_learner(learner_lib.model_logprob_fn(graphdef, chunk_size=8), grad_accum_steps=2)
  state, metrics = learner.step(learner.init_state(params, seed=0), on_policy_batch)
  assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.bfloat16)}
  assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
