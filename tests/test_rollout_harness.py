"""Rollout harness accounting: the sampler generates exactly the turns each method's keep rule allows.

The policy is the real batched Sampler on a tiny random model, wrapped so that every completion it
returns is swapped for a fixed reply holding a code block; the evaluator is scripted with fixed
outcomes per (task, episode, turn), so the expected rows and tokens follow from the keep rules.
The per-turn credit and truncation tests at the end use a model-free double (`ContextPolicy`).
"""
import dataclasses
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

import kernels_eval
from configs import smoke
from kernels_eval import schema
from kernels_eval.kernelbench import problems as kb_problems
from kernels_eval.kernelbench import sizes as kb_sizes
from kernels_eval.kernelbench import tasks as kb_tasks
from leap_jax import rewards
from leap_jax.rollout import methods
from leap_jax.rollout import prompts
from leap_jax.rollout.harness import NOT_GENERATED, STATUS_NAMES, TRUNCATED
from leap_jax.sampling import Completion
from leap_jax.train import batching
from leap_jax.train import build
from leap_jax.train.config import TrainConfig

P, G, T = 3, 4, 3
# OUTCOME[p, g, t]: whether turn t of episode (p, g) passes, if it is run.
OUTCOME = np.zeros((P, G, T), bool)
OUTCOME[0, :3, 0] = True  # easy group: 1 failure < t_min = 2, pruned by DCP
OUTCOME[1, 0, 1] = True  # all fail at turn 1 (4 <= t_max = 4): expanded; sample 0 passes at turn 2
OUTCOME[1, 1, 2] = True  # sample 1 passes at turn 3
OUTCOME[2, 0, 0] = True  # 3 failures: expanded
OUTCOME[2, 1, 2] = True
INFRA_ERROR = (2, 3)  # this episode's first evaluation always fails with an infrastructure error
REPLY = "```python\ndef solution(x):\n  return x\n```"
# Compiling the sampler dominates; on a loaded 2-core machine it can take minutes.
pytestmark = pytest.mark.timeout(900)


class RecordingPolicy:
  """Real Sampler calls; each completion is recorded, then replaced by a fixed code reply."""

  def __init__(self, sampler, reply_ids):
    self.sampler = sampler
    self.reply_ids = np.asarray(reply_ids, np.int32)
    self.calls = []  # (turn call index, rows, tokens the real sampler produced)

  def _swap(self, completions):
    self.calls.append(([c.row for c in completions], sum(len(c.tokens) for c in completions)))
    return [c if c.finish_reason == "truncated" else
            Completion(c.row, self.reply_ids, np.full(len(self.reply_ids), -1.0, np.float32), "stop")
            for c in completions]

  def start(self, weights, prompts, num_samples, key, **kw):
    state, completions = self.sampler.start(weights, prompts, num_samples, key, **kw)
    return state, self._swap(completions)

  def continue_(self, weights, state, rows, new_turn_tokens, key, **kw):
    state, completions = self.sampler.continue_(weights, state, rows, new_turn_tokens, key, **kw)
    return state, self._swap(completions)


class ScriptedEvaluator:
  """Fixed verdicts from OUTCOME, keyed by the request id "s<seed>-k<step>-e<episode>-t<turn>[-r<n>]"."""

  def __init__(self):
    self.requests = []

  def evaluate_many(self, requests):
    out = []
    for r in requests:
      self.requests.append(r.request_id)
      parts = r.request_id.split("-")
      e, t = int(parts[2][1:]), int(parts[3][1:])
      p, g = divmod(e, G)
      if (p, g) == INFRA_ERROR:
        out.append(schema.EvalResult(status="runtime_error", stage="correctness", infra_error="worker died"))
      elif OUTCOME[p, g, t]:
        out.append(schema.EvalResult(status="correct", stage="correctness", feedback="all trials passed"))
      else:
        out.append(schema.EvalResult(status="wrong_output", stage="correctness", feedback="max abs error 1.0"))
    return out


@pytest.fixture(scope="module")
def setup():
  cfg = smoke.get_config()
  cfg.rollout.num_problems, cfg.rollout.group_size, cfg.rollout.num_turns = P, G, T
  cfg.rollout.max_new_tokens = 4
  cfg.rollout.overlap = "off"
  config = TrainConfig.from_dict(cfg.to_dict())
  model, tokenizer = build.load_model(config.model, config.seed)
  policy = build.Policy.from_model(model, tokenizer, config.rollout.max_context_len)
  tasks = build.select_tasks("pallas", (0,), "train")[:P]
  reply_ids = list(tokenizer.encode(REPLY, add_special_tokens=False)) + [policy.chat.stop_ids[0]]
  return cfg, policy, tasks, reply_ids


_RUNS = {}


def make_rollout(cfg, policy, evaluator, method, sampler):
  """A rollout of `method` under the ConfigDict `cfg`, sampled by `sampler`."""
  config = TrainConfig.from_dict(cfg.to_dict())
  return build.Rollouts(config.rollout, config.dcp, config.tasks.lang, config.seed).make(policy, evaluator, method,
                                                                                        sampler)


def _run(setup, name):
  """Rollout of `name` (cached: each method is run once per module)."""
  if name not in _RUNS:
    _RUNS[name] = _rollout(setup, name)
  return _RUNS[name]


def _rollout(setup, name):
  cfg, policy, tasks, reply_ids = setup
  recorder = RecordingPolicy(policy.sampler, reply_ids)
  evaluator = ScriptedEvaluator()
  rollout = make_rollout(cfg, policy, evaluator, methods.get_method(name), recorder)
  return rollout.run(policy.params, tasks, step=0), recorder, evaluator, len(reply_ids)


def _expected_keep(name):
  """bool[P,G,T] from the reward library's own keep definitions, with the infra-error episode dropped."""
  valid = np.ones((P, G), bool)
  valid[INFRA_ERROR] = False
  success = jnp.asarray(OUTCOME)
  if name == "leap":
    active, _ = rewards.dcp_gate(success[..., 0], *methods.dcp_thresholds(G, -1, -1), jnp.asarray(valid))
  else:
    active = jnp.ones((P,), bool)
  keep = np.array(rewards.dcp_keep_mask(success, active, jnp.asarray(valid)))
  keep[INFRA_ERROR + (0,)] = True  # its turn 1 was generated before the evaluator failed
  return keep


@pytest.mark.parametrize("name", ["leap", "leap_no_dcp", "grpo_mt"])
def test_generates_exactly_the_kept_turns(setup, name):
  batch, recorder, evaluator, reply_len = _run(setup, name)
  keep = _expected_keep(name)
  np.testing.assert_array_equal(batch.generated, keep)
  rows = sum(len(r) for r, _ in recorder.calls)
  assert rows == keep.sum() == batch.counters["generated_rows"]
  assert batch.counters["generated_tokens"] == keep.sum() * reply_len
  real_tokens = sum(n for _, n in recorder.calls)
  assert 0 < real_tokens <= rows * 4  # what the real sampler decoded for those rows
  assert len(recorder.calls) == batch.counters["turn_calls"] <= T  # one batched call per turn
  retries = setup[0].rollout.eval_retries
  assert batch.counters["evaluator_calls"] == keep.sum() + retries
  assert not batch.valid[INFRA_ERROR] and batch.valid.sum() == P * G - 1
  assert sum(rid.startswith("s0-k0-e11-t0") for rid in evaluator.requests) == 1 + retries


def test_dcp_generates_less_than_unpruned_methods(setup):
  counts = {}
  for name in ("leap", "leap_no_dcp", "grpo_mt"):
    batch, *_ = _run(setup, name)
    counts[name] = (batch.counters["generated_rows"], batch.counters["generated_tokens"],
                    batch.counters["evaluator_calls"])
    if name == "leap":
      np.testing.assert_array_equal(batch.active, [False, True, True])
  assert all(a < b for a, b in zip(counts["leap"], counts["leap_no_dcp"]))
  assert all(a < b for a, b in zip(counts["leap"], counts["grpo_mt"]))


def test_overlap_samples_later_turns_in_two_calls_with_the_same_outcome(setup):
  cfg, policy, tasks, reply_ids = setup
  cfg = cfg.copy_and_resolve_references()
  cfg.rollout.overlap = "on"
  recorder = RecordingPolicy(policy.sampler, reply_ids)
  rollout = make_rollout(cfg, policy, ScriptedEvaluator(), methods.get_method("leap"), recorder)
  batch = rollout.run(policy.params, tasks, step=0)
  reference = _run(setup, "leap")[0]
  np.testing.assert_array_equal(batch.generated, reference.generated)
  np.testing.assert_array_equal(batch.success, reference.success)
  assert batch.counters["generated_rows"] == reference.counters["generated_rows"]
  assert len(recorder.calls) == batch.counters["turn_calls"] == 1 + 2 * (T - 1)


def test_single_turn_grpo_and_status_histogram(setup):
  batch, recorder, _, _ = _run(setup, "grpo")
  assert batch.generated.shape[-1] == 1 and len(recorder.calls) == 1
  names = {STATUS_NAMES[s] for s in batch.status.ravel() if s >= 0}
  assert names == {"correct", "wrong_output", "runtime_error"}
  assert TRUNCATED == len(schema.STATUSES)


def test_latest_context_starts_fresh_prompts(setup):
  cfg, policy, tasks, reply_ids = setup
  cfg = cfg.copy_and_resolve_references()
  cfg.rollout.context = "latest"
  recorder = RecordingPolicy(policy.sampler, reply_ids)
  rollout = make_rollout(cfg, policy, ScriptedEvaluator(), methods.get_method("leap"), recorder)
  batch = rollout.run(policy.params, tasks, step=0)
  np.testing.assert_array_equal(batch.generated, _expected_keep("leap"))
  e = 1 * G + 1  # expanded group 1, sample 1: three turns, three separate token records
  assert len(batch.segments[e]) == 3
  assert "Your previous attempt" in policy.chat.decode(batch.segments[e][1].prompt(0))


def test_truncated_episodes_stop_and_follow_the_config(setup):
  cfg, policy, tasks, reply_ids = setup
  system = prompts.system_message("pallas")
  longest = max(len(policy.chat.first_turn(kernels_eval.render_task(t, "pallas"), system)) for t in tasks)
  # Room for the turn-1 prompts and 4 new tokens: the feedback turn of a long prompt does not fit.
  small = dataclasses.replace(policy, sampler=type(policy.sampler)(
      policy.graphdef, policy.config, cache_len=longest + 8, stop_ids=policy.chat.stop_ids, pad_id=policy.pad_id))
  for truncated_as in ("failure", "invalid"):
    c = cfg.copy_and_resolve_references()
    c.rollout.truncated_as = truncated_as
    rollout = make_rollout(c, small, ScriptedEvaluator(), methods.get_method("leap_no_dcp"),
                           RecordingPolicy(small.sampler, reply_ids))
    batch = rollout.run(policy.params, tasks, step=0)
    truncated = batch.truncated.any(-1)
    assert truncated.any()
    first = np.argmax(batch.truncated, axis=-1)  # the turn that overflowed
    for p, g in zip(*np.nonzero(truncated)):
      assert not batch.generated[p, g, first[p, g]:].any()  # it and every later turn are never generated
    assert batch.counters["generated_rows"] == batch.generated.sum()
    expected_valid = np.ones((P, G), bool)
    expected_valid[INFRA_ERROR] = False
    if truncated_as == "invalid":
      expected_valid &= ~truncated
    np.testing.assert_array_equal(batch.valid, expected_valid)


def test_train_batch_can_drop_zero_advantage_episodes(setup):
  batch = _run(setup, "leap")[0]
  adv = np.ones((P, G, T), np.float32)
  adv[0] = 0.0  # group 0 carries no signal
  full = batching.to_train_batch(batch, adv)
  dropped = batching.to_train_batch(batch, adv, drop_zero_advantage=True)
  kept = [e for e in range(P * G) if e // G != 0 and divmod(e, G) != INFRA_ERROR]
  assert np.asarray(full.tokens).shape[0] == P * G
  assert np.asarray(dropped.tokens).shape[0] == len(kept)
  length = np.asarray(dropped.tokens).shape[1]
  for name in ("tokens", "policy_mask", "advantages", "old_logprobs"):
    np.testing.assert_array_equal(np.asarray(getattr(full, name))[kept, :length], np.asarray(getattr(dropped, name)))
  assert not np.asarray(full.policy_mask)[kept, length:].any()
  np.testing.assert_array_equal(full.group_ids, np.arange(P * G) // G)  # a row's group is its task
  np.testing.assert_array_equal(dropped.group_ids, np.asarray(kept) // G)
  padded = batching.to_train_batch(batch, adv, row_multiple=P * G + 3)
  np.testing.assert_array_equal(padded.group_ids[P * G:], -1)
  empty = batching.to_train_batch(batch, np.zeros_like(adv), drop_zero_advantage=True, row_multiple=2)
  assert np.asarray(empty.tokens).shape[0] == 2 and not np.asarray(empty.policy_mask).any()


class ContextPolicy:
  """A Sampler double without a model: every row replies `reply_ids` within `cache_len` tokens of context
  (an episode's turns so far under the "episode" policy, its fresh prompt under "latest"); a reply that does not
  fit is cut where the context ends and finishes as "truncated", as the Sampler's does."""

  def __init__(self, reply_ids, cache_len):
    self.reply_ids = np.asarray(reply_ids, np.int32)
    self.cache_len = cache_len

  def _reply(self, row, used):
    ids = self.reply_ids[:max(self.cache_len - used, 0)]
    reason = "stop" if len(ids) == len(self.reply_ids) else "truncated"
    return Completion(row, ids, np.full(len(ids), -1.0, np.float32), reason)

  def start(self, weights, prompts_, num_samples, key, **kw):
    used = [len(prompts_[r // num_samples]) for r in range(len(prompts_) * num_samples)]
    completions = [self._reply(r, n) for r, n in enumerate(used)]
    return [n + len(c.tokens) for n, c in zip(used, completions)], completions

  def continue_(self, weights, state, rows, new_turn_tokens, key, **kw):
    state, completions = list(state), []
    for r, ids in zip(rows, new_turn_tokens):
      completions.append(self._reply(int(r), state[r] + len(ids)))
      state[r] += len(ids) + len(completions[-1].tokens)
    return state, completions


class FailingEvaluator:
  """Every verdict is wrong_output: no group solves, so every kept row asks for another turn."""

  def evaluate_many(self, requests):
    return [schema.EvalResult(status="wrong_output", stage="correctness", feedback="max abs error 1.0")
            for _ in requests]


@pytest.mark.parametrize("name", ["leap", "kevin", "trloo"])
def test_each_turn_trains_on_its_own_advantage_under_both_contexts(setup, name):
  cfg, policy, tasks, reply_ids = setup
  method = methods.get_method(name)
  if name == "leap":
    method = dataclasses.replace(method, credit=methods.RankCredit(gamma=0.5))
  for context in prompts.CONTEXT_POLICIES:
    c = cfg.copy_and_resolve_references()
    c.rollout.context = context
    rollout = make_rollout(c, policy, ScriptedEvaluator(), method,
                           ContextPolicy(reply_ids, c.rollout.max_context_len))
    batch = rollout.run(policy.params, tasks, step=0)
    adv = methods.credit(method, batch.success, batch.keep, batch.valid, batch.speedup).advantages
    assert any(len(set(adv[p, g][batch.keep[p, g]])) > 1 for p, g in np.ndindex(P, G))  # turns differ
    train = batching.to_train_batch(batch, adv)
    # Rows follow the episodes, and an episode's turns follow each other (in one row or one row each).
    trained = np.asarray(train.advantages)[np.asarray(train.policy_mask)]
    expected = np.concatenate([np.full(batch.tokens[p, g, t], adv[p, g, t])
                               for p, g, t in np.ndindex(P, G, T) if batch.keep[p, g, t]])
    np.testing.assert_array_equal(trained, expected)


@pytest.mark.parametrize("num_turns", [3, 4])
@pytest.mark.parametrize("name", ["leap", "leap_no_dcp"])
def test_a_row_truncated_at_turn_1_stays_finished(setup, name, num_turns):
  cfg, policy, tasks, reply_ids = setup
  system = prompts.system_message("pallas")
  # Task 0's prompt leaves room for half a reply, task 1's for none; task 2 fits every turn.
  padded = [dataclasses.replace(t, statement=t.statement + " filler" * n) for t, n in zip(tasks, (400, 500, 0))]
  lengths = [len(policy.chat.first_turn(kernels_eval.render_task(t, "pallas"), system)) for t in padded]
  cache_len = lengths[0] + len(reply_ids) // 2
  assert lengths[1] >= cache_len and lengths[2] + num_turns * 100 < cache_len
  c = cfg.copy_and_resolve_references()
  c.rollout.num_turns, c.dcp.t_min, c.dcp.t_max = num_turns, -1, -1  # all-fail groups expand
  for context in prompts.CONTEXT_POLICIES:
    c.rollout.context = context
    rollout = make_rollout(c, policy, FailingEvaluator(), methods.get_method(name),
                           ContextPolicy(reply_ids, cache_len))
    batch = rollout.run(policy.params, padded, step=0)
    np.testing.assert_array_equal(batch.status[:2, :, 0], TRUNCATED)
    np.testing.assert_array_equal(batch.status[:2, :, 1:], NOT_GENERATED)
    assert batch.generated[0, :, 0].all() and not batch.generated[0, :, 1:].any() and not batch.generated[1].any()
    assert batch.generated[2].all() and batch.valid.all()


class RecordingEvaluator(FailingEvaluator):
  """FailingEvaluator that keeps the requests it was given."""

  def __init__(self):
    self.requests = []

  def evaluate_many(self, requests):
    self.requests += requests
    return super().evaluate_many(requests)


def test_kernelbench_cuda_tasks_take_the_python_fenced_modelnew(setup):
  """The task, not a guess, picks the block: the same reply gives a KernelBench CUDA task its ```python ModelNew
  file and an embedded-suite CUDA task its ```cuda block."""
  cfg, policy, tasks, _ = setup
  fixtures = pathlib.Path(__file__).parent / "fixtures" / "kernelbench"
  problem = kb_problems.find_problems(fixtures, ids=("kb1_2",))[0][0]
  check = kb_sizes.check_sizes(problem.constants)
  described = {"inputs": [{"name": "x", "shape": [check["rows"], check["cols"]], "dtype": "float32",
                           "torch_dtype": "float32"}], "params": [],
               "output": {"name": "out", "shape": [check["rows"]], "dtype": "float32", "torch_dtype": "float32"}}
  kb_task = kb_tasks.make_task(problem, described, check)
  answer = (fixtures / "answers" / "2_Mean_over_rows_cuda.py").read_text()
  kernel = "__global__ void k(float* y) { y[0] = 1.0f; }\n"
  reply = f"First a sketch:\n```cuda\n{kernel}```\nThe answer:\n```python\n{answer}```"
  reply_ids = list(policy.tokenizer.encode(reply, add_special_tokens=False)) + [policy.chat.stop_ids[0]]
  c = cfg.copy_and_resolve_references()
  c.tasks.lang, c.rollout.num_turns, c.rollout.max_context_len = "cuda", 1, 8192
  evaluator = RecordingEvaluator()
  rollout = make_rollout(c, policy, evaluator, methods.get_method("grpo_mt"), ContextPolicy(reply_ids, 8192))
  rollout.run(policy.params, [kb_task, tasks[0]], step=0)
  sources = {(r.task.id, r.source) for r in evaluator.requests}
  assert sources == {(kb_task.id, answer), (tasks[0].id, kernel)}, sources
  assert all(r.lang == "cuda" for r in evaluator.requests)
