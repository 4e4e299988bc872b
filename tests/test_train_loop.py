"""End-to-end: 2 RL steps of the smoke config with the real sampler, evaluator and learner.

A scripted test double replays each task's trusted solution as the turn-1 reply of sample 0 of
every group, so the real evaluator returns `correct` for those and the random policy fails the
rest: groups are mixed, advantages are nonzero and the parameters must move. The pool's turn-1
pass rate before and after RL (2 samples per task) is then exactly 1/2, and the held-out
evaluation (one trajectory per task, each one a replay) solves every task at turn 1.
"""
import json
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import kernels_eval
from configs import smoke
from leap_jax.models import Transformer
from leap_jax.models import pretrained
from leap_jax.rollout import prompts
from leap_jax.sampling import Completion, sequence_logprobs
from leap_jax.train import build
from leap_jax.train import checks
from leap_jax.train import loop
from leap_jax.train.config import TrainConfig

TASKS = {t.id: t for t in kernels_eval.load_tasks()}
# Compiling the sampler and the learner dominates; on a loaded 2-core machine it can take minutes.
pytestmark = pytest.mark.timeout(900)


class ReplayPolicy:
  """The policy's Sampler, except that turn-1 sample 0 of each prompt replays the trusted solution.

  Replayed tokens carry their log-probs under the sampled weights, as a sampler would record them.
  """

  def __init__(self, policy: build.Policy, lang: str, temperature: float):
    self.policy, self.lang = policy, lang
    self.replayed = 0
    self._logprobs = jax.jit(lambda w, t, m: sequence_logprobs(policy.graphdef, w, t, m, temperature=temperature))

  def _replay(self, weights, prompt, row):
    task_id = re.search(r"# Task (\w+) ", self.policy.chat.decode(prompt)).group(1)
    reply = prompts.solution_reply(self.lang, TASKS[task_id].solutions[self.lang])
    ids = list(self.policy.tokenizer.encode(reply, add_special_tokens=False)) + [self.policy.chat.stop_ids[0]]
    tokens = jnp.asarray([list(prompt) + ids], jnp.int32)
    mask = jnp.zeros(tokens.shape, bool).at[:, len(prompt):].set(True)
    logprobs = self._logprobs(weights, tokens, mask)
    self.replayed += 1
    return Completion(row, np.asarray(ids, np.int32), np.asarray(logprobs[0, len(prompt):]), "stop")

  def start(self, weights, prompts_, num_samples, key, **kw):
    state, completions = self.policy.sampler.start(weights, prompts_, num_samples, key, **kw)
    for p, prompt in enumerate(prompts_):
      completions[p * num_samples] = self._replay(weights, prompt, p * num_samples)
    return state, completions

  def continue_(self, weights, state, rows, new_turn_tokens, key, **kw):
    return self.policy.sampler.continue_(weights, state, rows, new_turn_tokens, key, **kw)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  cfg = smoke.get_config()
  cfg.workdir = str(tmp_path_factory.mktemp("smoke"))
  cfg.precheck.enabled = True
  cfg.precheck.after = True
  cfg.precheck.samples_per_task = 2
  cfg.heldout.at_end = True
  cfg.heldout.every = 2  # a held-out point before RL and after step 2, which the end of training reuses
  cfg.metrics.plot_at_end = True
  cfg.learner.kl_beta = 0.05  # KL to the frozen starting policy (the loop once passed no reference)
  cfg = TrainConfig.from_dict(cfg.to_dict())
  replays = []

  def make(policy):
    replays.append(ReplayPolicy(policy, cfg.tasks.lang, cfg.rollout.temperature))
    return replays[0]

  result = loop.train(cfg, policy_sampler=make, echo=lambda s: None)
  return cfg, result, replays[0]


def test_two_steps_train_on_mixed_groups(run):
  cfg, result, replay = run
  assert [row["step"] for row in result.history] == [0, 1]
  pool = build.select_tasks(cfg.tasks.lang, cfg.tasks.levels, cfg.tasks.split)
  heldout = build.select_tasks(cfg.tasks.lang, cfg.heldout.levels, cfg.heldout.split)
  assert replay.replayed == 2 * cfg.rollout.num_problems + 2 * len(pool) + 2 * len(heldout)
  for m in result.history:
    assert m["status/correct"] > 0  # the real evaluator accepted the replayed trusted solutions
    assert m["pass_rate/turn_1"] == pytest.approx(0.5)
    assert m["groups/signal_share"] > 0 and m["advantage/max"] > 0 > m["advantage/min"]
    assert m["cost/evaluator_calls"] >= cfg.rollout.num_problems
    assert m["groups/activated_share"] == 1.0  # G=2, one failure: t_min = 1 <= 1 <= t_max = 2
    assert m["cost/generated_rows"] > cfg.rollout.num_problems * cfg.rollout.group_size  # turn 2 happened
    assert np.isfinite(m["loss"]) and m["grad_norm"] > 0


def test_kl_to_the_frozen_starting_policy(run):
  """With kl_beta > 0 the reference is the starting policy: KL 0 at step 0 and > 0 once the policy moved; each
  step's loss is its policy-gradient loss plus beta x the logged KL (token mean, one update per step)."""
  cfg, result, _ = run
  first, second = result.history
  assert first["kl_ref"] == pytest.approx(0.0, abs=1e-7) and second["kl_ref"] > 1e-7
  for m in result.history:  # abs: f32 rounding of two sums of about 1 added in different orders
    assert m["loss"] - m["pg_loss"] == pytest.approx(cfg.learner.kl_beta * m["kl_ref"], rel=1e-2, abs=2e-6)


def test_parameters_changed_and_outputs_written(run):
  cfg, result, _ = run
  initial = nnx.state(Transformer(build.model_config(cfg.model), rngs=nnx.Rngs(cfg.seed)))
  moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), initial, result.state.params)
  assert max(jax.tree.leaves(moved)) > 0
  assert int(result.state.step) == 2
  workdir = pathlib.Path(cfg.workdir)
  assert (workdir / "checkpoints").is_dir() and (workdir / "run_record.json").is_file()
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  assert len(lines) == 2 and "time/learn" in json.loads(lines[0])
  episodes = [json.loads(l) for l in (workdir / "episodes" / "step_0000000.jsonl").read_text().splitlines()]
  assert episodes[0]["turns"][0]["status"] == "correct" and "def solution" in episodes[0]["turns"][0]["code"]


def test_pass_rates_before_and_after_rl_and_heldout(run):
  cfg, result, _ = run
  pool = build.select_tasks(cfg.tasks.lang, cfg.tasks.levels, cfg.tasks.split)
  for check in (result.precheck, result.postcheck):
    assert check["pass_rate@1"] == pytest.approx(0.5)  # sample 0 replays, sample 1 is the random policy's
    assert check["per_task"] == {t.id: 0.5 for t in pool}
  workdir = pathlib.Path(cfg.workdir)
  assert json.loads((workdir / "postcheck.json").read_text())["pass_rate@1"] == pytest.approx(0.5)
  assert result.heldout["Acc@1"] == result.heldout["Acc@2"] == 1.0
  assert all(turn == 1 for turn in result.heldout["solved_by_turn"].values())
  curve = [json.loads(line) for line in (workdir / "heldout_curve.jsonl").read_text().splitlines()]
  assert [p["step"] for p in curve] == [0, 2] and curve[0]["cumulative/seconds"] == 0.0
  steps = result.history
  assert curve[1]["cumulative/generated_tokens"] == sum(m["cost/generated_tokens"] for m in steps) > 0
  assert curve[1]["cumulative/evaluator_calls"] == steps[-1]["cumulative/evaluator_calls"] > 0
  assert steps[-1]["heldout/Acc@1"] == 1.0 and "heldout/Acc@1" not in steps[0]
  assert (workdir / "plots" / "heldout_vs_cost.png").exists()


def test_final_policy_exported_and_latest_checkpoint_restored(run):
  cfg, result, _ = run
  flat = lambda tree: jax.tree.leaves(jax.tree.map(np.asarray, tree))  # noqa: E731
  policy, step = loop.latest_policy(cfg)
  assert step == 2
  for a, b in zip(flat(policy.params), flat(result.state.params), strict=True):
    np.testing.assert_array_equal(a, b)
  exported, _ = pretrained.load_pretrained(pathlib.Path(cfg.workdir) / "policy", scan_layers=cfg.model.scan_layers)
  for a, b in zip(flat(nnx.state(exported)), flat(result.state.params), strict=True):
    np.testing.assert_array_equal(a, b)


def test_heldout_accuracy_averages_over_samples(run):
  """Two trajectories per held-out problem at temperature 1: sample 0 replays the solution (solved at turn 1),
  sample 1 is the random policy's 8-token reply (never solved), so every Acc@t and every task's row is 1/2."""
  cfg, _, _ = run
  policy, _ = loop.latest_policy(cfg)
  with build.make_evaluator(cfg.evaluator) as evaluator:
    tasks = build.heldout_tasks(cfg.tasks, cfg.heldout, evaluator, lambda s: None)
    result = checks.heldout_accuracy(build.Rollouts.of(cfg), policy, evaluator, tasks, cfg.heldout.num_turns,
                                     temperature=1.0, sampler=ReplayPolicy(policy, cfg.tasks.lang, 1.0), samples=2)
  assert result["Acc@1"] == result["Acc@2"] == 0.5
  assert result["per_task"] == {t.id: [0.5, 0.5] for t in tasks} and "solved_by_turn" not in result
  assert result["generated_rows"] == len(tasks) * (2 + 1)  # only the failing sample gets turn 2
