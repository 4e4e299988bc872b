"""Measuring a policy outside training steps: the pool's turn-1 pass rate, held-out Acc@1..Acc@T, and the
latest checkpoint's policy (to evaluate or export as a HF folder)."""
from __future__ import annotations

import os
import pathlib
from typing import Any, Sequence

import numpy as np
from flax import nnx

from leap_jax.rollout import methods as methods_lib
from leap_jax.train import optim
from leap_jax.train.build import Policy, Rollouts
from leap_jax.train.checkpoint import Checkpointer
from leap_jax.train.learner import Learner, LearnerConfig

# Step numbers that key the sampler and the evaluator outside training steps (never reached by RL).
PRECHECK_STEP = 1 << 30
HELDOUT_STEP = (1 << 30) + 1


def turn1_pass_rate(rollouts: Rollouts, policy: Policy, evaluator, tasks: Sequence[Any], samples_per_task: int,
                    step: int = PRECHECK_STEP, sampler=None) -> dict[str, Any]:
  """Share of turn-1 samples that pass, over `tasks` x `samples_per_task`.

  Tasks are sampled in chunks of at most the training batch's P*G rows (the memory a step needs),
  by `sampler` (default: the policy's own). Returns {"pass_rate@1", "per_task": {id: rate}, "seconds"}.
  """
  settings = rollouts.settings
  chunk = max(1, settings.num_problems * settings.group_size // samples_per_task)
  grpo = methods_lib.get_method("grpo")
  passed, valid, per_task, seconds = 0, 0, {}, 0.0
  for i in range(0, len(tasks), chunk):
    part = list(tasks[i:i + chunk])
    rollout = rollouts.make(policy, evaluator, grpo, sampler, num_problems=len(part), group_size=samples_per_task,
                            num_turns=1)
    batch = rollout.run(policy.params, part, step=step + i)
    success = batch.success[:, :, 0]
    passed += int(success[batch.valid].sum())
    valid += int(batch.valid.sum())
    per_task.update({tid: float(r) for tid, r in zip(batch.task_ids, success.mean(axis=1))})
    seconds += batch.timings["generate"] + batch.timings["evaluate"]
  return {"pass_rate@1": passed / max(valid, 1), "per_task": per_task, "seconds": seconds}


def heldout_accuracy(rollouts: Rollouts, policy: Policy, evaluator, tasks: Sequence[Any], num_turns: int,
                     temperature: float, step: int = HELDOUT_STEP, sampler=None, samples: int = 1
                     ) -> dict[str, Any]:
  """Acc@1..Acc@T over `samples` trajectories per problem; every unsolved trajectory gets all T turns (no pruning).

  Acc@t = mean over problems and their samples of 1[solved at some turn <= t]. Returns {"Acc@t",
  "generated_rows", "seconds"} and, with one sample (the papers' protocol), "solved_by_turn": {id: turn or None}
  and "speedup_at_solve": {id: speedup of the first passing turn, None where untimed or unsolved}; with more,
  "per_task": {id: [its Acc@1..Acc@T]}.
  """
  rollout = rollouts.make(policy, evaluator, methods_lib.get_method("leap_no_dcp"), sampler,
                          num_problems=len(tasks), group_size=samples, num_turns=num_turns, temperature=temperature)
  batch = rollout.run(policy.params, tasks, step=step)
  solved_by = np.cumsum(batch.success & batch.generated, axis=-1) > 0  # [P, S, T]
  out: dict[str, Any] = {f"Acc@{t + 1}": float(solved_by[..., t].mean()) for t in range(num_turns)}
  if samples > 1:
    out["per_task"] = {tid: [float(a) for a in row.mean(axis=0)] for tid, row in zip(batch.task_ids, solved_by)}
  else:
    out.update(_first_solves(batch, solved_by[:, 0]))
  out["generated_rows"] = batch.counters["generated_rows"]
  out["seconds"] = batch.timings["generate"] + batch.timings["evaluate"]
  return out


def _first_solves(batch, solved_by: np.ndarray) -> dict[str, Any]:
  """{"solved_by_turn", "speedup_at_solve"} of one trajectory per problem; solved_by bool[P, T]."""
  solved_by_turn = {tid: int(np.argmax(row)) + 1 if row.any() else None for tid, row in zip(batch.task_ids, solved_by)}
  speedup = batch.speedup[:, 0, :]  # [P, T]
  return {"solved_by_turn": solved_by_turn,
          "speedup_at_solve": {tid: float(speedup[p, turn - 1]) if turn and np.isfinite(speedup[p, turn - 1])
                               else None for p, (tid, turn) in enumerate(solved_by_turn.items())}}


def latest_params(policy: Policy, workdir: str | os.PathLike, optim_config: optim.OptimConfig,
                  learner_config: LearnerConfig) -> tuple[Any, int]:
  """(params, step) of the latest RL checkpoint in `workdir`; (the policy's own params, 0) without one.

  The optimiser and learner configs give the checkpoint's state structure (the run's own sections)."""
  if not (pathlib.Path(workdir) / "checkpoints").is_dir():
    return policy.params, 0
  learner = Learner.for_model(policy.graphdef, optim.make_optimizer(optim_config), learner_config)
  checkpointer = Checkpointer(workdir, every=1, keep=1, async_save=False)
  try:
    restored = checkpointer.restore_latest(learner.abstract_state(policy.params))
  finally:
    checkpointer.close()
  if restored is None:
    return policy.params, 0
  return restored["state"].params, int(restored["step"])


def export_policy(policy: Policy, out_dir: str | os.PathLike) -> pathlib.Path:
  """Writes the policy as a HF folder (safetensors + config + tokenizer) that `model.base` and the PROPEL
  solver (`solver.model.base`) load."""
  from leap_jax.models.hf_io import save_hf_checkpoint  # pylint: disable=import-outside-toplevel
  save_hf_checkpoint(nnx.merge(policy.graphdef, policy.params), policy.tokenizer, out_dir)
  return pathlib.Path(out_dir)

