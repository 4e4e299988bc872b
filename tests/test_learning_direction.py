"""The direction of learning: pass/fail outcomes -> a method's credit -> the learner's steps move every episode's
log-probability the way its advantage points (up for rewarded answers, down for the others)."""
import numpy as np
import pytest
from flax import nnx

from configs import common
from leap_jax.models import ModelConfig, Transformer
from leap_jax.rollout import methods
from leap_jax.train import learner as learner_lib
from leap_jax.train import optim
from leap_jax.train.batch import batch_from_numpy
from leap_jax.train.config import from_mapping

TINY = dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
L, PROMPT, ANSWER = 32, 10, 12
# success[P, G]: one task with one pass in four, one with three; an all-fail and an all-pass task (no signal).
SUCCESS = np.array([[1, 0, 0, 0], [1, 1, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]], bool)


@pytest.fixture(scope="module")
def tiny():
  return nnx.split(Transformer(ModelConfig.from_hf_config(TINY), rngs=nnx.Rngs(0)))


def _episodes(graphdef, params):
  """Rows task prompt ++ its own answer (trained), group id = task; old log-probs the model's own (on-policy)."""
  P, G = SUCCESS.shape
  rng = np.random.default_rng(0)
  tokens, policy = np.zeros((P * G, L), np.int32), np.zeros((P * G, L), bool)
  for p in range(P):
    prompt = rng.integers(1, 64, PROMPT)
    for g in range(G):
      tokens[p * G + g, :PROMPT + ANSWER] = np.concatenate([prompt, rng.integers(1, 64, ANSWER)])
      policy[p * G + g, PROMPT:PROMPT + ANSWER] = True
  logprob_fn = learner_lib.model_logprob_fn(graphdef, chunk_size=None)
  own = np.asarray(logprob_fn(params, tokens, tokens > 0))
  return tokens, policy, np.where(policy, own, 0.0).astype(np.float32), logprob_fn


def _learner(graphdef, shared_prefix: bool):
  optim_cfg, learner_cfg = common.optim(), common.learner()
  optim_cfg.learning_rate = 3e-3
  learner_cfg.shared_prefix = shared_prefix
  typed_optim = from_mapping(optim.OptimConfig, optim_cfg.to_dict())
  config = from_mapping(learner_lib.LearnerConfig, learner_cfg.to_dict(), grad_accum_steps=1)
  return learner_lib.Learner.for_model(graphdef, optim.make_optimizer(typed_optim), config, chunk_size=None)


@pytest.mark.parametrize("method,shared_prefix", [("leap", True), ("grpo", True), ("leap", False)])
def test_steps_raise_rewarded_answers_and_lower_the_others(tiny, method, shared_prefix):
  graphdef, params = tiny
  tokens, policy, old, logprob_fn = _episodes(graphdef, params)
  P, G = SUCCESS.shape
  keep = np.ones((P, G, 1), bool)
  credit = methods.credit(methods.get_method(method), SUCCESS[..., None], keep, np.ones((P, G), bool),
                          np.full((P, G, 1), np.nan, np.float32))
  adv = credit.advantages[..., 0].reshape(-1)
  assert (adv[:8] != 0).all() and (adv[8:] == 0).all()  # the mixed tasks carry signal, the others none
  batch = batch_from_numpy(tokens, policy, np.where(policy, adv[:, None], 0.0), old, input_mask=tokens > 0,
                           group_ids=np.repeat(np.arange(P, dtype=np.int32), G))
  learner = _learner(graphdef, shared_prefix)
  state = learner.init_state(params, seed=0)
  for _ in range(3):
    state, _ = learner.step(state, batch)
  new = np.asarray(logprob_fn(state.params, tokens, tokens > 0))
  change = np.where(policy, new - old, 0.0).sum(1)  # per episode: log pi_new(answer) - log pi_old(answer)
  rewarded, penalised = adv > 0, adv < 0
  assert (change[rewarded] > 0).all(), (method, change[rewarded])
  assert (change[penalised] < 0).all(), (method, change[penalised])
