"""The learner's shared-prefix layout: units of rows sharing a prompt give the per-row step's loss, metrics and
parameter updates (fp32), alone, with accumulation, TIS and the reference KL, and under a mesh of 8 devices."""
import jax
import numpy as np
import optax
import pytest
from flax import nnx

from leap_jax.models import ModelConfig, Transformer
from leap_jax.models import sharding as model_sharding
from leap_jax.train import grouping
from leap_jax.train import learner as learner_lib
from leap_jax.sampling.buckets import bucket
from leap_jax.train.batch import batch_from_numpy

TINY = dict(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
L = 40


@pytest.fixture(scope="module")
def tiny():
  graphdef, params = nnx.split(Transformer(ModelConfig.from_hf_config(TINY), rngs=nnx.Rngs(0)))
  return graphdef, params


def multi_turn_rows(seed: int, group_sizes=(4, 3, 4, 1), padding_rows: int = 4):
  """Rows = group prompt ++ answer (trained) ++ feedback ++ answer (trained), right-padded; rows of the groups
  interleaved, one row of group 1 with nothing trained (a dropped episode), `padding_rows` empty rows (-1)."""
  rng = np.random.default_rng(seed)
  rows = []
  for n, size in enumerate(group_sizes):
    prompt = rng.integers(1, 64, rng.integers(6, 12))
    for _ in range(size):
      a1, f, a2 = (rng.integers(1, 64, k) for k in (rng.integers(2, 7), rng.integers(2, 5), rng.integers(0, 6)))
      tokens = np.concatenate([prompt, a1, f, a2])
      trained = np.concatenate([np.zeros(len(prompt)), np.ones(len(a1)), np.zeros(len(f)), np.ones(len(a2))])
      rows.append((n, tokens, trained.astype(bool)))
  rows = [rows[i] for i in rng.permutation(len(rows))]
  B = len(rows) + padding_rows
  tokens, policy = np.zeros((B, L), np.int32), np.zeros((B, L), bool)
  input_mask, groups = np.zeros((B, L), bool), np.full(B, -1, np.int32)
  for b, (n, t, trained) in enumerate(rows):
    tokens[b, :len(t)], policy[b, :len(t)], input_mask[b, :len(t)], groups[b] = t, trained, True, n
  policy[np.flatnonzero(groups == 1)[0]] = False
  advantages = np.repeat(rng.normal(size=(B, 1)), L, axis=1) * policy
  return tokens, input_mask, policy, advantages.astype(np.float32), groups


@pytest.fixture(scope="module")
def grouped_batch(tiny):
  """An on-policy batch (sampler log-probs = the model's own, minus noise so ratios differ from 1)."""
  graphdef, params = tiny
  tokens, input_mask, policy, advantages, groups = multi_turn_rows(0)
  own = learner_lib.model_logprob_fn(graphdef, chunk_size=8)(params, tokens, input_mask)
  old = np.asarray(own) - 0.05 * np.random.default_rng(1).random(tokens.shape) * policy
  return batch_from_numpy(tokens, policy, advantages, old.astype(np.float32), input_mask=input_mask,
                          group_ids=groups)


def test_group_batch_layout_shares_untrained_prefixes(grouped_batch):
  batch = grouped_batch
  units, stats = grouping.group_batch(batch, unit_multiple=4)
  U, R, Ls = units.tokens.shape
  Lp = units.prefix_tokens.shape[1]
  assert U % 4 == 0 and (U, R, Lp, Ls) == (bucket(U), bucket(R), bucket(Lp, 16), bucket(Ls, 16))
  groups = np.asarray(batch.group_ids)
  kept = np.flatnonzero(np.asarray(batch.policy_mask).any(1))
  assert set(groups[kept]) == {0, 1, 2, 3} and len(kept) == 11  # padding rows and the untrained row left out
  assert units.policy_mask.sum() == batch.policy_mask.sum()
  np.testing.assert_allclose(np.sort(units.advantages[units.policy_mask]),
                             np.sort(np.asarray(batch.advantages)[np.asarray(batch.policy_mask)]))
  # Every kept row is its unit's prefix followed by one of the suffixes packed in the unit's slots (contiguous,
  # named by where they start, offsets 0, 1, ...); the prefix holds no trained token; some slot holds two.
  rebuilt, shared_slot = {}, False
  for u in range(U):
    n = units.prefix_len[u]
    for r in range(R):
      ids = set(units.episodes[u, r][units.episodes[u, r] >= 0])
      shared_slot |= len(ids) > 1
      for e in ids:
        cols = units.episodes[u, r] == e
        np.testing.assert_array_equal(units.offsets[u, r][cols], np.arange(cols.sum()))
        start = np.flatnonzero(cols)[0]
        assert e == r * Ls + start and cols.sum() == np.flatnonzero(cols)[-1] - start + 1
        assert units.policy_mask[u, r][cols][-1]
        rebuilt[tuple(np.concatenate([units.prefix_tokens[u, :n], units.tokens[u, r][cols]]))] = e
  assert len(rebuilt) == len(kept) and shared_slot
  for b in kept:
    end = np.flatnonzero(batch.policy_mask[b])[-1] + 1
    assert tuple(batch.tokens[b, :end]) in rebuilt
  assert stats.row_positions == batch.tokens.size and stats.positions == U * (Lp + R * Ls)
  assert 0 <= stats.padding < stats.positions
  assert stats.metrics()["learner/positions_saved"] == pytest.approx(1 - stats.positions / batch.tokens.size)


def test_groups_are_cut_into_enough_units():
  ids = np.array([5, 5, 5, 5, 7, 7, 7, 7])
  assert len(set(grouping.unit_ids(ids, 1))) == 2
  assert len(set(grouping.unit_ids(ids, 4))) == 4  # two units of 2 rows per group
  assert len(set(grouping.unit_ids(ids, 16))) == 8  # one row per unit: as many units as rows
  with pytest.raises(ValueError, match="group_ids"):
    grouping.group_batch(batch_from_numpy(np.ones((2, 4)), np.ones((2, 4)), np.zeros((2, 4)), np.zeros((2, 4))))


def test_pack_slots_first_fit_longest_first():
  unit = np.array([0, 0, 0, 0, 1, 1])
  slot, column, most = grouping.pack_slots(unit, np.array([3, 7, 2, 5, 8, 8]), width=8)
  assert slot.tolist() == [1, 0, 2, 1, 0, 1] and column.tolist() == [5, 0, 0, 0, 0, 0] and most == 3


def _step(tiny, batch, shared: bool, mesh=None, steps=1, **overrides):
  graphdef, params = tiny
  config = learner_lib.LearnerConfig(shared_prefix=shared, **overrides)
  learner = learner_lib.Learner.for_model(graphdef, optax.sgd(1.0), config, chunk_size=8, mesh=mesh)
  specs = None if mesh is None else model_sharding.partition_specs(params, mesh)
  state = learner.init_state(params, seed=0, param_specs=specs)
  ref = None
  if config.kl_beta > 0:  # a reference away from the policy, so that KL > 0
    ref = learner.reference_params(jax.tree.map(lambda x: x * 0.9, params), specs)
  history = []
  for _ in range(steps):
    state, metrics = learner.step(state, batch, ref)
    history.append(metrics)
  return state, history


CASES = {
    "plain": {},
    "accumulated_sequence_mean": dict(grad_accum_steps=2, aggregation="sequence_mean"),
    "tis_kl_two_passes": dict(mu=2, tis_cap=1.02, kl_beta=0.1, eps_low=0.02, eps_high=0.02),
}


@pytest.mark.parametrize("case", list(CASES))
def test_shared_prefix_step_equals_the_per_row_step(tiny, grouped_batch, case):
  """SGD with lr 1, so the parameter change is the gradient itself."""
  _, params = tiny
  rows_state, rows_hist = _step(tiny, grouped_batch, False, **CASES[case])
  units_state, units_hist = _step(tiny, grouped_batch, True, **CASES[case])
  for key in ("loss", "pg_loss", "grad_norm", "clip_fraction", "approx_kl", "policy_tokens", "kl_ref", "tis_weight"):
    if key in rows_hist[0]:
      assert units_hist[0][key] == pytest.approx(rows_hist[0][key], rel=1e-5, abs=1e-7), key
  for a, b, p in zip(jax.tree.leaves(units_state.params), jax.tree.leaves(rows_state.params), jax.tree.leaves(params)):
    np.testing.assert_allclose(np.asarray(a) - p, np.asarray(b) - p, rtol=1e-4, atol=1e-6)
  assert units_hist[0]["learner/positions"] < rows_hist[0]["learner/positions"]
  assert rows_hist[0]["learner/positions_saved"] == 0.0 and units_hist[0]["learner/positions_saved"] > 0.3


def test_shared_prefix_step_on_a_mesh_matches_one_device(tiny, grouped_batch):
  mesh = model_sharding.make_mesh(2, 2, 2)
  single, single_hist = _step(tiny, grouped_batch, True, steps=2, grad_accum_steps=2)
  sharded, sharded_hist = _step(tiny, grouped_batch, True, mesh=mesh, steps=2, grad_accum_steps=2)
  assert any(not x.sharding.is_fully_replicated for x in jax.tree.leaves(sharded.params))
  for a, b in zip(jax.tree.leaves(sharded.params), jax.tree.leaves(single.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  assert sharded_hist[1]["loss"] == pytest.approx(single_hist[1]["loss"], rel=1e-5, abs=1e-7)


def test_constant_aggregation_needs_its_token_budget():
  with pytest.raises(ValueError, match="norm_length"):
    learner_lib.LearnerConfig(aggregation="constant")
