"""The RL training loop: rollout -> credit -> TrainBatch -> learner step -> hooks.

`train` builds the run (`build`), measures the pool before and after (`checks`), and registers held-out
evaluation, metrics, episode dumps, progress lines and checkpoints as hooks (`hooks`), each on its schedule.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import time
from typing import Any, Callable

import jax

from leap_jax.metrics import curves
from leap_jax.metrics.compile_time import compile_seconds
from leap_jax.metrics import episodes as episodes_lib
from leap_jax.metrics import plots
from leap_jax.metrics import writer as writer_lib
from leap_jax.models import sharding as model_sharding
from leap_jax.rollout import methods as methods_lib
from leap_jax.rollout.task_pool import TaskPool
from leap_jax.sampling.logprobs import effective_temperature
from leap_jax.train import batching
from leap_jax.train import build
from leap_jax.train import checks
from leap_jax.train import hooks as hooks_lib
from leap_jax.train import optim
from leap_jax.train.checkpoint import Checkpointer
from leap_jax.train.config import TrainConfig
from leap_jax.train.learner import Learner, row_multiple
from leap_jax.train.preemption import StopRequest
from leap_jax.train.run_record import write_run_record

BAR_KEYS = ("pass_rate/turn_1", "groups/activated_share", "loss", "time/step")


@dataclasses.dataclass
class TrainResult:
  """What `train` returns: per-step metrics, the final train state, the pool's turn-1 pass rates before
  and after RL, and the held-out result."""
  history: list[dict[str, float]]
  state: Any
  precheck: dict[str, Any] | None
  heldout: dict[str, Any] | None
  seconds: float
  postcheck: dict[str, Any] | None = None


@dataclasses.dataclass
class Run:
  """The built parts of a run and its moving state."""
  config: TrainConfig
  policy: build.Policy
  evaluator: Any
  sampler: Any
  tasks: list
  heldout_tasks: list
  pool: TaskPool
  rollouts: build.Rollouts
  method: methods_lib.Method
  learner: Learner
  checkpointer: Checkpointer
  state: Any
  ref_params: Any
  first_step: int
  row_multiple: int
  echo: Callable[[str], None]
  cost: dict[str, float] = dataclasses.field(default_factory=curves.zero_cost)

  @property
  def directory(self) -> pathlib.Path:
    return pathlib.Path(self.config.workdir)

  def with_params(self, params: Any) -> build.Policy:
    return dataclasses.replace(self.policy, params=params)

  def pool_check(self, name: str, when: str, params: Any, before: dict[str, Any] | None = None) -> dict[str, Any]:
    """The pool's turn-1 pass rate under `params`, echoed and written to `<workdir>/<name>.json` (the same
    tasks and sampling keys every time, so before and after RL are a paired comparison)."""
    samples = self.config.precheck.samples_per_task
    check = checks.turn1_pass_rate(self.rollouts, self.with_params(params), self.evaluator, self.tasks, samples,
                                   sampler=self.sampler)
    was = f" (before: {before['pass_rate@1']:.3f})" if before is not None else ""
    self.echo(f"turn-1 pass rate {when}: {check['pass_rate@1']:.3f}{was} over {len(self.tasks)} tasks x "
              f"{samples} samples ({check['seconds']:.0f} s)")
    (self.directory / f"{name}.json").write_text(json.dumps(check, indent=2))
    return check

  def heldout(self, params: Any) -> dict[str, Any]:
    h = self.config.heldout
    return checks.heldout_accuracy(self.rollouts, self.with_params(params), self.evaluator, self.heldout_tasks,
                                   h.num_turns, h.temperature, sampler=self.sampler, samples=h.samples)


def train(config: TrainConfig, *, policy_sampler: Callable[[build.Policy], Any] | None = None,
          evaluator=None, echo: Callable[[str], None] = print) -> TrainResult:
  """Runs `config.steps` RL steps from the starting policy (resuming from `<workdir>/checkpoints`).

  Args:
    config: the run config.
    policy_sampler: optional factory policy -> sampler-like object used for rollouts, pass-rate checks and
      the held-out evaluation instead of the policy's own Sampler (tests use it to script some episodes).
    evaluator: optional evaluator (default: one built from `config.evaluator`, closed on every exit path).
    echo: progress printer.
  """
  started = time.perf_counter()
  with contextlib.ExitStack() as stack:
    if evaluator is None:
      evaluator = stack.enter_context(build.make_evaluator(config.evaluator))
    run = setup(config, evaluator, policy_sampler, echo)
    with contextlib.closing(run.checkpointer):
      precheck = run.pool_check("precheck", "before RL", run.state.params) if (
          config.precheck.enabled and run.first_step == 0) else None
      hooks, writer, latest = step_hooks(run)
      with writer:
        if config.heldout.every > 0 and run.first_step == 0:
          hooks.run(hooks_lib.StepInfo(0, run.state, dict(run.cost)), names=("heldout",))
        stopped = run_steps(run, hooks)
    history, postcheck, heldout = finish(run, precheck, latest, stopped)
  return TrainResult(history, run.state, precheck, heldout, time.perf_counter() - started, postcheck)


def setup(config: TrainConfig, evaluator, policy_sampler, echo) -> Run:
  """Builds the policy, tasks, rollouts, learner and train state (restored from the latest checkpoint)."""
  method = methods_lib.get_method(config.method)
  directory = pathlib.Path(config.workdir)
  directory.mkdir(parents=True, exist_ok=True)
  mesh = build.make_mesh(config.mesh)
  model, tokenizer = build.load_start_policy(config.model, config.sft.start_dir, config.seed, mesh)
  policy = build.Policy.from_model(model, tokenizer, config.rollout.max_context_len)
  del model
  if method.timed_score and jax.default_backend() == "cpu":
    echo(f"note: method {method.name} scores speedups only where kernels are timed; on CPU nothing is timed, so "
         f"its per-turn score degenerates to correctness only")
  tasks = build.pool_tasks(config.tasks)
  h = config.heldout
  rollouts = build.Rollouts.of(config)
  temperature = effective_temperature(config.rollout.temperature)
  learner = Learner.for_model(policy.graphdef, optim.make_optimizer(config.optim), config.learner,
                              temperature=temperature, mesh=mesh,
                              lr_schedule=optim.learning_rate_schedule(config.optim))
  specs = model_sharding.partition_specs(policy.params, mesh) if mesh is not None else None
  # The KL reference is the starting policy (the SFT model when enabled), also when resuming.
  ref_params = (learner.reference_params(policy.params, specs, config.learner.ref_dtype or None)
                if config.learner.kl_beta > 0 else None)
  c = config.checkpoint
  checkpointer = Checkpointer(directory, every=c.every, keep=c.keep, async_save=c.async_save)
  pool = TaskPool(tasks, seed=config.seed)
  state = restore_or_init(config, learner, checkpointer, pool, policy.params, specs, echo)
  sampler = policy_sampler(policy) if policy_sampler is not None else None
  policy.params = None
  return Run(config, policy, evaluator, sampler, tasks, build.heldout_tasks(config.tasks, h, evaluator, echo),
             pool, rollouts, method, learner, checkpointer, state, ref_params, int(state.step),
             row_multiple(config.learner, mesh), echo)


def restore_or_init(config: TrainConfig, learner: Learner, checkpointer: Checkpointer, pool: TaskPool,
                    params: Any, specs: Any, echo) -> Any:
  """The latest checkpoint's train state (and the pool's order), or a fresh state with a run record."""
  restored = checkpointer.restore_latest(learner.abstract_state(params, specs))
  if restored is None:
    write_run_record(config.workdir, config.to_dict(), {"seed": config.seed})
    return learner.init_state(params, config.seed, specs)
  pool.load_state_dict(restored["sampler"]["task_pool"])
  echo(f"resumed from step {restored['step']} in {checkpointer.directory}")
  return restored["state"]


def step_hooks(run: Run) -> tuple[hooks_lib.Hooks, writer_lib.MetricsWriter, dict[str, Any]]:
  """The hooks after each step, in order: held-out curve, metrics row, episode dump, progress line, checkpoint
  (the stop request is read after the others ran, as the checkpoint hook needs it).

  Returns (hooks, the metrics writer to close, the latest held-out result {"step", "result"}).
  """
  config, directory = run.config, run.directory
  chief = jax.process_index() == 0
  m = config.metrics
  writer = writer_lib.MetricsWriter(directory, tensorboard=m.tensorboard, progress_bar=m.progress_bar,
                                     total_steps=config.steps, initial_step=run.first_step, bar_keys=BAR_KEYS,
                                     enabled=chief)
  run.cost = curves.resumed_cost([row for row in recorded_metrics(directory) if row["step"] < run.first_step])
  latest: dict[str, Any] = {}
  hooks = hooks_lib.Hooks()
  if config.heldout.every > 0:
    hooks.add("heldout", hooks_lib.heldout_hook(directory, run.heldout, run.echo, latest),
              every=config.heldout.every)
    curves.start_curve(directory, run.first_step)
  hooks.add("metrics", lambda info: writer.write(info.step - 1, info.metrics))
  dumper = episodes_lib.EpisodeDumper(directory, every=m.episode_dump_every, max_episodes=m.episodes_per_dump,
                                     enabled=m.episode_dumps and chief)
  if dumper.enabled:
    hooks.add("episodes", lambda info: dumper.maybe_dump(info.step - 1, hooks_lib.episode_records(
        info.batch, run.policy.chat, dumper.max_episodes)), every=dumper.every, offset=1)
  hooks.add("progress", lambda info: run.echo(progress_line(info, config.steps, config.rollout.num_turns)))
  hooks.add("checkpoint", lambda info: run.checkpointer.save(
      info.step, info.state, {"task_pool": run.pool.state_dict()}, config.to_dict(), force=True),
            every=config.checkpoint.every, at_last=True)
  return hooks, writer, latest


def run_steps(run: Run, hooks: hooks_lib.Hooks) -> bool:
  """Steps from `run.first_step` to `config.steps`, hooks after each; returns whether a stop was requested."""
  config = run.config
  with StopRequest() as stop:
    for step in range(run.first_step, config.steps):
      t0, compiled = time.perf_counter(), compile_seconds()
      tasks = build.process_slice(run.pool.draw(config.rollout.num_problems))
      batch = run.rollouts.make(run.policy, run.evaluator, run.method, run.sampler).run(
          build.sampling_weights(run.state.params), tasks, step)
      credit = methods_lib.credit(run.method, batch.success, batch.keep, batch.valid, batch.speedup)
      train_batch = batching.to_train_batch(
          batch, credit.advantages, pad_id=run.policy.pad_id, row_multiple=run.row_multiple,
          drop_zero_advantage=config.learner.drop_zero_advantage and config.learner.kl_beta == 0)
      t1 = time.perf_counter()
      run.state, learn_metrics = run.learner.step(run.state, train_batch, run.ref_params)
      t2 = time.perf_counter()
      metrics = batching.rollout_metrics(batch, credit.advantages, credit.reward)
      metrics.update(learn_metrics)
      metrics.update({"time/learn": t2 - t1 - learn_metrics["time/learn_compile"], "time/step": t2 - t0,
                      "time/compile": compile_seconds() - compiled, "train/rows": float(train_batch.batch_size),
                      "train/length": float(train_batch.tokens.shape[1])})
      run.cost = curves.add_step_cost(run.cost, metrics)
      metrics.update(run.cost)
      info = hooks_lib.StepInfo(step + 1, run.state, metrics, batch, final=step + 1 == config.steps,
                                stop_requested=stop.requested_anywhere)
      hooks.run(info)
      if info.stopping:
        run.echo(f"stop requested: checkpointed step {step + 1}")
        break
  return stop.requested


def finish(run: Run, precheck: dict[str, Any] | None, latest: dict[str, Any], stopped: bool):
  """After the last step: the HF export, plots, the pool's pass rate after RL and the final held-out result
  (after a stop request only the plots). Returns (history, postcheck, heldout)."""
  config, chief = run.config, jax.process_index() == 0
  if config.checkpoint.export_hf and not stopped:
    final = run.with_params(build.sampling_weights(run.state.params))  # every process joins the gather
    if chief:
      run.echo(f"final policy written to {checks.export_policy(final, run.directory / 'policy')} (HF folder)")
  history = recorded_metrics(run.directory)
  if config.metrics.plot_at_end and history and chief:
    plots.plot_workdir(run.directory)
  if stopped:
    return history, None, None
  postcheck = None
  if config.precheck.enabled and config.precheck.after:
    postcheck = run.pool_check("postcheck", "after RL", run.state.params, before=precheck)
  heldout = None
  if config.heldout.at_end:
    heldout = latest.get("result") if latest.get("step") == int(run.state.step) else None
    if heldout is None:
      heldout = run.heldout(run.state.params)
      run.echo(f"held-out {hooks_lib.accuracy_text(heldout)}")
    (run.directory / "heldout.json").write_text(json.dumps(heldout, indent=2))
  return history, postcheck, heldout


def recorded_metrics(directory: pathlib.Path) -> list[dict[str, float]]:
  """The metrics rows the run has written so far (none before its first step)."""
  return writer_lib.read_metrics(directory) if (directory / writer_lib.METRICS_FILE).exists() else []


def progress_line(info: hooks_lib.StepInfo, steps: int, num_turns: int) -> str:
  m = info.metrics
  passes = " ".join(f"{m[f'pass_rate/turn_{t}']:.2f}" for t in range(1, num_turns + 1)
                    if f"pass_rate/turn_{t}" in m)
  return (f"step {info.step}/{steps} pass@turn [{passes}] active {m['groups/activated_share']:.2f} "
          f"rows {m['cost/generated_rows']:.0f} tokens {m['cost/generated_tokens']:.0f} "
          f"evals {m['cost/evaluator_calls']:.0f} loss {m['loss']:.4f} clip {m['clip_fraction']:.3f} "
          f"kl {m['approx_kl']:.2e} gen {m['time/generate']:.0f}s eval {m['time/evaluate']:.0f}s "
          f"learn {m['time/learn']:.0f}s compile {m['time/compile']:.0f}s")


def latest_policy(config: TrainConfig) -> tuple[build.Policy, int]:
  """(policy, step) of the latest RL checkpoint in the workdir; (the starting policy, 0) without one."""
  model, tokenizer = build.load_start_policy(config.model, config.sft.start_dir, config.seed)
  policy = build.Policy.from_model(model, tokenizer, config.rollout.max_context_len)
  policy.params, step = checks.latest_params(policy, config.workdir, config.optim, config.learner)
  return policy, step


def evaluate_checkpoint(config: TrainConfig, evaluator=None, echo: Callable[[str], None] = print) -> dict[str, Any]:
  """Held-out Acc@1..Acc@T of the latest RL checkpoint in the workdir (else the starting policy).

  Writes `<workdir>/heldout_eval.json` and returns the result with the evaluated "step" (0 = no RL).
  """
  policy, step = latest_policy(config)
  h = config.heldout
  rollouts = build.Rollouts.of(config)
  with contextlib.ExitStack() as stack:
    if evaluator is None:
      evaluator = stack.enter_context(build.make_evaluator(config.evaluator))
    tasks = build.heldout_tasks(config.tasks, h, evaluator, echo)
    echo(f"held-out evaluation of step {step} on {len(tasks)} tasks, {h.num_turns} turns")
    result = checks.heldout_accuracy(rollouts, policy, evaluator, tasks, h.num_turns, h.temperature,
                                     samples=h.samples)
  result["step"] = step
  workdir = pathlib.Path(config.workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "heldout_eval.json").write_text(json.dumps(result, indent=2))
  return result
