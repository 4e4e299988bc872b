"""The RL training loop: rollout -> rewards -> TrainBatch -> learner step -> metrics -> checkpoint.

Also the pieces launch scripts share: building the policy (embedded, HF folder, GGUF, random or
the cold-start SFT checkpoint), the task pools, the evaluator, the turn-1 pass-rate check, the
held-out Acc@1..Acc@T evaluation, and a dry run that builds only shapes (nnx.eval_shape).
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

import kernels_eval
from leap_jax.metrics import curves
from leap_jax.metrics import episodes as episodes_lib
from leap_jax.metrics import plots
from leap_jax.metrics import writer as writer_lib
from leap_jax.models import ModelConfig, Transformer
from leap_jax.models import pretrained
from leap_jax.models import sharding as model_sharding
from leap_jax.models.gguf_io import gguf_tokenizer
from leap_jax.models.hf_io import load_tokenizer
from leap_jax.rollout import batching
from leap_jax.rollout import methods as methods_lib
from leap_jax.rollout.harness import Rollout, RolloutBatch, RolloutSettings, STATUS_NAMES
from leap_jax.rollout.task_pool import TaskPool
from leap_jax.sampling import ChatFormat, Sampler
from leap_jax.sampling.logprobs import effective_temperature
from leap_jax.train import optim
from leap_jax.train.batch import TrainBatch
from leap_jax.train.checkpoint import Checkpointer
from leap_jax.train.learner import Learner, LearnerConfig, model_logprob_fn
from leap_jax.train.preemption import StopRequest
from leap_jax.train.run_record import write_run_record

# Step numbers that key the sampler and the evaluator outside training steps (never reached by RL).
PRECHECK_STEP = 1 << 30
HELDOUT_STEP = (1 << 30) + 1


def workdir(cfg: ml_collections.ConfigDict) -> pathlib.Path:
  return pathlib.Path(cfg.workdir)


def sft_dir(cfg: ml_collections.ConfigDict) -> pathlib.Path:
  """The cold-start SFT checkpoint folder (a HF folder)."""
  return pathlib.Path(cfg.sft.checkpoint_dir) if cfg.sft.checkpoint_dir else workdir(cfg) / "sft"


def policy_dir(cfg: ml_collections.ConfigDict) -> pathlib.Path:
  """The final RL policy as a HF folder (written at the end of `train`, or by launch/export_policy.py)."""
  return workdir(cfg) / "policy"


def has_sft_checkpoint(cfg: ml_collections.ConfigDict) -> bool:
  return (sft_dir(cfg) / "config.json").is_file()


def _load_tokenizer(source: str):
  if source in pretrained.EMBEDDED:
    import gguf  # pylint: disable=import-outside-toplevel
    return gguf_tokenizer(gguf.GGUFReader(pretrained.embedded_gguf_path(source)))
  if os.path.isdir(source):
    return load_tokenizer(source)
  raise FileNotFoundError(f"model.tokenizer {source!r} is neither an embedded model {sorted(pretrained.EMBEDDED)} "
                          "nor a folder")


def model_config(cfg: ml_collections.ConfigDict) -> ModelConfig:
  """The architecture from `model.base`'s config.json when it is a folder, else from `model.arch`."""
  m = cfg.model
  kw = dict(dtype=m.dtype, param_dtype=m.param_dtype, scan_layers=m.scan_layers, remat=m.remat)
  if os.path.isfile(os.path.join(str(m.base), "config.json")):
    return ModelConfig.from_hf_config(m.base, **kw)
  return ModelConfig.from_hf_config(dict(m.arch), **kw)


def load_base_model(cfg: ml_collections.ConfigDict, mesh=None) -> tuple[Transformer, Any]:
  """(model, tokenizer) of `model.base` (embedded name, HF folder, .gguf, or "random" from `model.arch`)."""
  m = cfg.model
  if m.base == "random":
    model = Transformer(model_config(cfg), rngs=nnx.Rngs(cfg.seed))
    return model, _load_tokenizer(m.tokenizer)
  return pretrained.load_pretrained(m.base, dtype=m.dtype, param_dtype=m.param_dtype, scan_layers=m.scan_layers,
                                    remat=m.remat, mesh=mesh)


def load_policy(cfg: ml_collections.ConfigDict, mesh=None) -> tuple[Transformer, Any]:
  """The policy RL starts from: the SFT checkpoint when `sft.enabled`, else the base model."""
  if not cfg.sft.enabled:
    return load_base_model(cfg, mesh)
  if not has_sft_checkpoint(cfg):
    raise FileNotFoundError(f"sft.enabled but no SFT checkpoint in {sft_dir(cfg)}; run launch/sft.py first "
                            "(launch/train.py does this automatically)")
  m = cfg.model
  return pretrained.load_pretrained(str(sft_dir(cfg)), dtype=m.dtype, param_dtype=m.param_dtype,
                                    scan_layers=m.scan_layers, remat=m.remat, mesh=mesh)


def select_tasks(lang: str, levels: Sequence[int], split: str, ids: Sequence[str] = (),
                 folder: str = "") -> list[kernels_eval.Task]:
  """Tasks of `split` at `levels`, optionally only `ids`.

  Without `folder`: the embedded suite's tasks that have a trusted `lang` solution. With `folder`: every
  task file there (e.g. the valid tasks `launch/train_generator.py` exports; they carry no solutions and
  are evaluated as untrusted code).
  """
  source = kernels_eval.load_tasks(folder or None)
  tasks = [t for t in source if t.split == split and t.level in tuple(levels) and (folder or lang in t.solutions)]
  if ids:
    unknown = sorted(set(ids) - {t.id for t in source})
    if unknown:
      raise ValueError(f"unknown task ids {unknown}" + (f" in {folder}" if folder else ""))
    tasks = [t for t in tasks if t.id in set(ids)]
  if not tasks:
    where = f"in {folder}" if folder else f"with a {lang} solution in the embedded suite"
    raise ValueError(f"no tasks {where} with split={split!r} levels={tuple(levels)} ids={tuple(ids)}")
  return tasks


def make_evaluator(cfg: ml_collections.ConfigDict) -> kernels_eval.Evaluator:
  e = cfg.evaluator
  return kernels_eval.Evaluator(workers=e.workers, timeout_s=e.timeout_s or None, isolation=e.isolation)


def make_mesh(cfg: ml_collections.ConfigDict):
  if not cfg.mesh.enabled:
    return None
  return model_sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)


@dataclasses.dataclass
class Policy:
  """A policy ready to sample: model structure, weights, tokenizer, chat format and sampler."""
  graphdef: nnx.GraphDef
  params: Any
  tokenizer: Any
  chat: ChatFormat
  sampler: Sampler
  config: ModelConfig

  @classmethod
  def from_model(cls, model: Transformer, tokenizer, cache_len: int) -> "Policy":
    graphdef, params = nnx.split(model)
    chat = ChatFormat(tokenizer)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else chat.stop_ids[0]
    sampler = Sampler(graphdef, model.config, cache_len=cache_len, stop_ids=chat.stop_ids, pad_id=pad)
    return cls(graphdef, params, tokenizer, chat, sampler, model.config)

  @property
  def pad_id(self) -> int:
    return self.sampler.pad_id


def rollout_settings(cfg: ml_collections.ConfigDict, **overrides) -> RolloutSettings:
  values = {f.name: cfg.rollout[f.name] for f in dataclasses.fields(RolloutSettings) if f.name in cfg.rollout}
  values.update(overrides)
  return RolloutSettings(**values)


def make_rollout(cfg: ml_collections.ConfigDict, policy: Policy, evaluator, method: methods_lib.Method,
                 settings: RolloutSettings, sampler=None) -> Rollout:
  dcp = (methods_lib.dcp_thresholds(settings.group_size, cfg.dcp.t_min, cfg.dcp.t_max)
         if method.keep_rule == "dcp" else (0, settings.group_size))  # thresholds only matter to DCP
  return Rollout(sampler or policy.sampler, policy.chat, evaluator, method=method, settings=settings,
                 lang=cfg.tasks.lang, seed=cfg.seed, dcp=dcp)


def turn1_pass_rate(cfg: ml_collections.ConfigDict, policy: Policy, evaluator, tasks: Sequence[Any],
                    samples_per_task: int, step: int = PRECHECK_STEP, sampler=None) -> dict[str, float]:
  """Share of turn-1 samples that pass, over `tasks` x `samples_per_task`.

  Tasks are sampled in chunks of at most the training batch's P*G rows (the memory a step needs),
  by `sampler` (default: the policy's own).
  """
  chunk = max(1, cfg.rollout.num_problems * cfg.rollout.group_size // samples_per_task)
  grpo = methods_lib.get_method("grpo")
  passed, valid, per_task, seconds = 0, 0, {}, 0.0
  for i in range(0, len(tasks), chunk):
    part = list(tasks[i:i + chunk])
    settings = rollout_settings(cfg, num_problems=len(part), group_size=samples_per_task, num_turns=1)
    batch = make_rollout(cfg, policy, evaluator, grpo, settings, sampler).run(policy.params, part, step=step + i)
    success = batch.success[:, :, 0]
    passed += int(success[batch.valid].sum())
    valid += int(batch.valid.sum())
    per_task.update({tid: float(r) for tid, r in zip(batch.task_ids, success.mean(axis=1))})
    seconds += batch.timings["generate"] + batch.timings["evaluate"]
  return {"pass_rate@1": passed / max(valid, 1), "per_task": per_task, "seconds": seconds}


def heldout_accuracy(cfg: ml_collections.ConfigDict, policy: Policy, evaluator, tasks: Sequence[Any],
                     num_turns: int, step: int = HELDOUT_STEP, sampler=None) -> dict[str, Any]:
  """Acc@1..Acc@T: one trajectory per problem, every unsolved trajectory gets all T turns (no pruning)."""
  settings = rollout_settings(cfg, num_problems=len(tasks), group_size=1, num_turns=num_turns,
                              temperature=cfg.heldout.temperature)
  rollout = make_rollout(cfg, policy, evaluator, methods_lib.get_method("leap_no_dcp"), settings, sampler)
  batch = rollout.run(policy.params, tasks, step=step)
  solved_by = np.cumsum(batch.success & batch.generated, axis=-1)[:, 0, :] > 0  # [P, T]
  out: dict[str, Any] = {f"Acc@{t + 1}": float(solved_by[:, t].mean()) for t in range(num_turns)}
  out["solved_by_turn"] = {tid: int(np.argmax(row)) + 1 if row.any() else None
                           for tid, row in zip(batch.task_ids, solved_by)}
  out["generated_rows"] = batch.counters["generated_rows"]
  out["seconds"] = batch.timings["generate"] + batch.timings["evaluate"]
  return out


def heldout_point(cfg: ml_collections.ConfigDict, policy: Policy, evaluator, tasks: Sequence[Any], step: int,
                  cost: dict[str, float], sampler=None) -> dict[str, Any]:
  """`heldout_accuracy` of `policy`, appended to the run's accuracy-against-cost curve at `step`."""
  result = heldout_accuracy(cfg, policy, evaluator, tasks, cfg.heldout.num_turns, sampler=sampler)
  curves.append_point(workdir(cfg), step, cost, result)
  return result


def _accuracy_text(result: dict[str, Any]) -> str:
  return " ".join(f"{k}={v:.3f}" for k, v in curves.accuracies(result).items())


def heldout_due(cfg: ml_collections.ConfigDict, done: int) -> bool:
  """Whether the held-out curve gets a point after `done` steps (before the first step too)."""
  return cfg.heldout.every > 0 and done % cfg.heldout.every == 0


def process_slice(tasks: Sequence[Any]) -> list[Any]:
  """This process's contiguous share of a step's tasks (every process draws the same tasks)."""
  n, i = jax.process_count(), jax.process_index()
  if len(tasks) % n:
    raise ValueError(f"rollout.num_problems={len(tasks)} must be a multiple of the {n} processes")
  share = len(tasks) // n
  return list(tasks[i * share:(i + 1) * share])


def sampling_weights(params: Any) -> Any:
  """The parameters the sampler reads: as they are on one process; gathered to every host with several,
  where each process samples its own rows with a full local copy."""
  if jax.process_count() == 1:
    return params
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  return jax.tree.map(jnp.asarray, multihost_utils.process_allgather(params, tiled=True))


def row_multiple(cfg: ml_collections.ConfigDict, mesh) -> int:
  shards = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]
  return int(np.lcm(cfg.learner.num_minibatches * cfg.optim.grad_accum_steps, shards))


def episode_records(batch: RolloutBatch, chat: ChatFormat, limit: int) -> list[dict[str, Any]]:
  """JSON records of the first `limit` episodes: per turn the reply, extracted code and verdict."""
  P, G, T = batch.generated.shape
  records = []
  for e in range(min(limit, P * G)):
    p, g = divmod(e, G)
    segments = batch.segments[e]
    generated = [t for t in range(T) if batch.generated[p, g, t]]
    per_turn = len(segments) == len(generated) and all(s.num_turns <= 1 for s in segments)
    turns = []
    for t in range(T):
      if batch.status[p, g, t] < 0:
        continue
      reply = ""
      if batch.generated[p, g, t]:
        segment, turn = (segments[generated.index(t)], 0) if per_turn else (segments[0], t)
        reply = chat.decode(segment.completion(turn), skip_special_tokens=True)
      result = batch.results.get((p, g, t))
      turns.append({"turn": t + 1, "status": STATUS_NAMES[batch.status[p, g, t]], "reply": reply,
                    "code": batch.codes.get((p, g, t)), "feedback": result.feedback if result is not None else ""})
    records.append({"task_id": batch.task_ids[p], "group": p, "sample": g, "valid": bool(batch.valid[p, g]),
                    "turns": turns})
  return records


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


def train(cfg: ml_collections.ConfigDict, *, policy_sampler: Callable[[Policy], Any] | None = None,
          evaluator=None, echo: Callable[[str], None] = print) -> TrainResult:
  """Runs `cfg.steps` RL steps from the policy `load_policy(cfg)` (resuming from `<workdir>/checkpoints`).

  Args:
    cfg: the run config (configs/default.py).
    policy_sampler: optional factory policy -> sampler-like object used for rollouts, pass-rate checks and
      the held-out evaluation instead of the policy's own Sampler (tests use it to script some episodes).
    evaluator: optional evaluator (default: `make_evaluator(cfg)`).
    echo: progress printer.
  """
  started = time.perf_counter()
  method = methods_lib.get_method(cfg.method)
  directory = workdir(cfg)
  directory.mkdir(parents=True, exist_ok=True)
  mesh = make_mesh(cfg)
  model, tokenizer = load_policy(cfg, mesh)
  policy = Policy.from_model(model, tokenizer, cfg.rollout.max_context_len)
  del model
  own_evaluator = evaluator is None
  evaluator = make_evaluator(cfg) if own_evaluator else evaluator
  if method.timed_score and jax.default_backend() == "cpu":
    echo(f"note: method {method.name} scores speedups only where kernels are timed; on CPU nothing is timed, so "
         f"its per-turn score degenerates to correctness only")
  tasks = select_tasks(cfg.tasks.lang, cfg.tasks.levels, cfg.tasks.split, cfg.tasks.ids, cfg.tasks.folder)
  pool = TaskPool(tasks, seed=cfg.seed)
  settings = rollout_settings(cfg)
  sampler = policy_sampler(policy) if policy_sampler is not None else None
  rollout = make_rollout(cfg, policy, evaluator, method, settings, sampler)

  learner_cfg = LearnerConfig.from_configs(cfg.learner, cfg.optim)
  temperature = effective_temperature(settings.temperature)
  learner = Learner(model_logprob_fn(policy.graphdef, temperature=temperature), optim.make_optimizer(cfg.optim),
                    learner_cfg, mesh=mesh, lr_schedule=optim.learning_rate_schedule(cfg.optim))
  specs = model_sharding.partition_specs(policy.params, mesh) if mesh is not None else None
  # The KL reference is the starting policy (the SFT model when enabled), also when resuming.
  ref_params = (learner.reference_params(policy.params, specs, cfg.learner.ref_dtype or None)
                if learner_cfg.kl_beta > 0 else None)
  checkpointer = Checkpointer(directory, every=cfg.checkpoint.every, keep=cfg.checkpoint.keep,
                              async_save=cfg.checkpoint.async_save)
  restored = checkpointer.restore_latest(learner.abstract_state(policy.params, specs))
  if restored is not None:
    state = restored["state"]
    pool.load_state_dict(restored["sampler"]["task_pool"])
    echo(f"resumed from step {restored['step']} in {checkpointer.directory}")
  else:
    state = learner.init_state(policy.params, cfg.seed, specs)
    write_run_record(directory, cfg, {"seed": cfg.seed})
  policy.params = None
  first_step = int(state.step)

  def pool_check(name: str, when: str, params: Any, before: dict[str, Any] | None = None) -> dict[str, Any]:
    """The pool's turn-1 pass rate under `params`, echoed and written to `<workdir>/<name>.json` (the
    same tasks and sampling keys every time, so before and after RL are a paired comparison)."""
    check = turn1_pass_rate(cfg, dataclasses.replace(policy, params=params), evaluator, tasks,
                            cfg.precheck.samples_per_task, sampler=sampler)
    was = f" (before: {before['pass_rate@1']:.3f})" if before is not None else ""
    echo(f"turn-1 pass rate {when}: {check['pass_rate@1']:.3f}{was} over {len(tasks)} tasks x "
         f"{cfg.precheck.samples_per_task} samples ({check['seconds']:.0f} s)")
    with open(directory / f"{name}.json", "w") as f:
      json.dump(check, f, indent=2)
    return check

  precheck = None
  if cfg.precheck.enabled and first_step == 0:
    precheck = pool_check("precheck", "before RL", state.params)
  history = writer_lib.read_metrics(directory) if (directory / writer_lib.METRICS_FILE).exists() else []
  cost = curves.resumed_cost([row for row in history if row["step"] < first_step])
  heldout_tasks = select_tasks(cfg.tasks.lang, cfg.heldout.levels, cfg.heldout.split)
  latest_heldout: tuple[int, dict[str, Any]] | None = None

  def heldout_now(done: int, params: Any) -> dict[str, Any]:
    nonlocal latest_heldout
    result = heldout_point(cfg, dataclasses.replace(policy, params=params), evaluator, heldout_tasks, done, cost,
                           sampler)
    echo(f"held-out after {done} steps {_accuracy_text(result)}"
         f" (cost so far: {cost['cumulative/seconds']:.0f} s, {cost['cumulative/generated_tokens']:.0f} tokens, "
         f"{cost['cumulative/evaluator_calls']:.0f} evaluator calls)")
    latest_heldout = (done, result)
    return result

  if cfg.heldout.every > 0:
    curves.start_curve(directory, first_step)
    if first_step == 0:
      heldout_now(0, state.params)

  chief = jax.process_index() == 0
  writer = writer_lib.MetricsWriter(directory, tensorboard=cfg.metrics.tensorboard,
                                     progress_bar=cfg.metrics.progress_bar, total_steps=cfg.steps,
                                     initial_step=first_step, bar_keys=BAR_KEYS, enabled=chief)
  dumper = episodes_lib.EpisodeDumper(directory, every=cfg.metrics.episode_dump_every,
                                     max_episodes=cfg.metrics.episodes_per_dump,
                                     enabled=cfg.metrics.episode_dumps and chief)
  rows_multiple = row_multiple(cfg, mesh)
  with StopRequest() as stop:
    for step in range(first_step, cfg.steps):
      t0 = time.perf_counter()
      step_tasks = process_slice(pool.draw(settings.num_problems))
      batch = rollout.run(sampling_weights(state.params), step_tasks, step)
      credit = methods_lib.credit(method, batch.success, batch.keep, batch.valid, batch.speedup)
      train_batch = batching.to_train_batch(
          batch, credit.advantages, pad_id=policy.pad_id, row_multiple=rows_multiple,
          drop_zero_advantage=cfg.learner.drop_zero_advantage and cfg.learner.kl_beta == 0)
      t1 = time.perf_counter()
      state, learn_metrics = learner.step(state, train_batch, ref_params)
      t2 = time.perf_counter()
      metrics = batching.rollout_metrics(batch, credit.advantages, credit.reward)
      metrics.update(learn_metrics)
      metrics.update({"time/learn": t2 - t1, "time/step": t2 - t0, "train/rows": float(train_batch.batch_size),
                      "train/length": float(train_batch.tokens.shape[1])})
      cost = curves.add_step_cost(cost, metrics)
      metrics.update(cost)
      if heldout_due(cfg, step + 1):
        accuracy = heldout_now(step + 1, state.params)
        metrics.update({f"heldout/{k}": v for k, v in curves.accuracies(accuracy).items()})
      writer.write(step, metrics)
      if dumper.due(step):
        dumper.maybe_dump(step, episode_records(batch, policy.chat, dumper.max_episodes))
      echo(_progress_line(step, cfg.steps, metrics, settings.num_turns))
      done = step + 1
      stopping = stop.requested_anywhere()
      checkpointer.save(done, state, {"task_pool": pool.state_dict()}, cfg,
                        force=stopping or done == cfg.steps)
      if stopping:
        echo(f"stop requested: checkpointed step {done}")
        break
  checkpointer.close()
  writer.close()
  if cfg.checkpoint.export_hf and not stop.requested:
    final = dataclasses.replace(policy, params=sampling_weights(state.params))  # every process joins the gather
    if chief:
      echo(f"final policy written to {export_policy(final, policy_dir(cfg))} (HF folder)")
  history = writer_lib.read_metrics(directory) if (directory / writer_lib.METRICS_FILE).exists() else []
  if cfg.metrics.plot_at_end and history and chief:
    plots.plot_workdir(directory)
  postcheck = None
  if cfg.precheck.enabled and cfg.precheck.after and not stop.requested:
    postcheck = pool_check("postcheck", "after RL", state.params, before=precheck)
  heldout = None
  if cfg.heldout.at_end and not stop.requested:
    final_step = int(state.step)
    if latest_heldout is not None and latest_heldout[0] == final_step:
      heldout = latest_heldout[1]
    else:
      heldout = heldout_accuracy(cfg, dataclasses.replace(policy, params=state.params), evaluator, heldout_tasks,
                                 cfg.heldout.num_turns, sampler=sampler)
      echo(f"held-out {_accuracy_text(heldout)}")
    with open(directory / "heldout.json", "w") as f:
      json.dump(heldout, f, indent=2)
  if own_evaluator:
    evaluator.close()
  return TrainResult(history, state, precheck, heldout, time.perf_counter() - started, postcheck)


BAR_KEYS = ("pass_rate/turn_1", "groups/activated_share", "loss", "time/step")


def _progress_line(step: int, steps: int, m: dict[str, float], num_turns: int) -> str:
  passes = " ".join(f"{m[f'pass_rate/turn_{t}']:.2f}" for t in range(1, num_turns + 1)
                    if f"pass_rate/turn_{t}" in m)
  return (f"step {step + 1}/{steps} pass@turn [{passes}] active {m['groups/activated_share']:.2f} "
          f"rows {m['cost/generated_rows']:.0f} tokens {m['cost/generated_tokens']:.0f} "
          f"evals {m['cost/evaluator_calls']:.0f} loss {m['loss']:.4f} clip {m['clip_fraction']:.3f} "
          f"kl {m['approx_kl']:.2e} gen {m['time/generate']:.0f}s eval {m['time/evaluate']:.0f}s "
          f"learn {m['time/learn']:.0f}s")


def dry_run(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
  """Builds the model abstractly (nnx.eval_shape), the mesh, the learner state and batch shapes; allocates nothing.

  Returns a summary: parameter count, mesh shape, train-state bytes, batch shape, task counts.
  """
  methods_lib.get_method(cfg.method)
  settings = rollout_settings(cfg)
  methods_lib.dcp_thresholds(settings.group_size, cfg.dcp.t_min, cfg.dcp.t_max)
  model_cfg = model_config(cfg)
  abstract_model = nnx.eval_shape(lambda: Transformer(model_cfg, rngs=nnx.Rngs(0)))
  graphdef, abstract_params = nnx.split(abstract_model)
  mesh = model_sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor) if cfg.mesh.enabled else None
  specs = model_sharding.partition_specs(abstract_params, mesh) if mesh is not None else None
  learner = Learner(model_logprob_fn(graphdef), optim.make_optimizer(cfg.optim),
                    LearnerConfig.from_configs(cfg.learner, cfg.optim), mesh=mesh)
  state = learner.abstract_state(abstract_params, specs)
  rows = cfg.rollout.num_problems * cfg.rollout.group_size
  rows = -(-rows // row_multiple(cfg, mesh)) * row_multiple(cfg, mesh)
  length = cfg.rollout.max_context_len
  batch = TrainBatch(
      tokens=jax.ShapeDtypeStruct((rows, length), jnp.int32),
      input_mask=jax.ShapeDtypeStruct((rows, length), jnp.bool_),
      policy_mask=jax.ShapeDtypeStruct((rows, length), jnp.bool_),
      advantages=jax.ShapeDtypeStruct((rows, length), jnp.float32),
      old_logprobs=jax.ShapeDtypeStruct((rows, length), jnp.float32))
  tasks = select_tasks(cfg.tasks.lang, cfg.tasks.levels, cfg.tasks.split, cfg.tasks.ids, cfg.tasks.folder)
  leaves = jax.tree.leaves(abstract_params)
  return {
      "params": int(sum(np.prod(x.shape) for x in leaves)),
      "state_bytes": int(sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(state))),
      "mesh": None if mesh is None else dict(mesh.shape),
      "batch": tuple(batch.tokens.shape),
      "tasks": len(tasks),
      "model": model_cfg,
  }


def _config_path(argv: Sequence[str], flag: str) -> str | None:
  for i, arg in enumerate(argv):
    if arg == f"--{flag}" and i + 1 < len(argv):
      return argv[i + 1]
    if arg.startswith(f"--{flag}="):
      return arg.split("=", 1)[1]
  return None


def _unknown_override(argv: Sequence[str], flag: str) -> str | None:
  """The first `--<flag>.<path>=...` whose path is not a field of the config file's `get_config()`."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  path = _config_path(argv, flag)
  if path is None or not os.path.isfile(path):
    return None
  spec = importlib.util.spec_from_file_location("_launch_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  for arg in argv:
    if not arg.startswith(f"--{flag}."):
      continue
    field = arg[len(flag) + 3:].split("=", 1)[0]
    node = config
    for part in field.split("."):
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        return field
      node = node[part]
  return None


def parse_config(argv: Sequence[str], flag_values=None, flag: str = "config") -> ml_collections.ConfigDict:
  """Parses `--config <file> --config.<field>=<value> ...` (ml_collections config_flags).

  Raises SystemExit with a message naming the field for an unknown field, and with absl's message for
  a value of the wrong type.
  """
  from absl import flags  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  flag_values = flags.FLAGS if flag_values is None else flag_values
  if flag not in flag_values:
    config_flags.DEFINE_config_file(flag, flag_values=flag_values, help_string="the run's config file",
                                    sys_argv=list(argv))
  try:
    flag_values(list(argv))
  except (AttributeError, KeyError) as e:
    field = _unknown_override(argv, flag)
    raise SystemExit(f"error: unknown config field {field!r}" if field else f"error: bad config override ({e})")
  except flags.Error as e:
    raise SystemExit(f"error: {e}")
  config = flag_values[flag].value
  if config is None:
    raise SystemExit(f"error: --{flag} <file> is required")
  return config


def latest_policy(cfg: ml_collections.ConfigDict) -> tuple[Policy, int]:
  """(policy, step) of the latest RL checkpoint in the workdir; (the starting policy, 0) without one."""
  model, tokenizer = load_policy(cfg)
  policy = Policy.from_model(model, tokenizer, cfg.rollout.max_context_len)
  del model
  step = 0
  checkpoints = workdir(cfg) / "checkpoints"
  if checkpoints.is_dir():
    learner = Learner(model_logprob_fn(policy.graphdef), optim.make_optimizer(cfg.optim),
                      LearnerConfig.from_configs(cfg.learner, cfg.optim))
    checkpointer = Checkpointer(workdir(cfg), every=cfg.checkpoint.every, keep=cfg.checkpoint.keep,
                                async_save=False)
    restored = checkpointer.restore_latest(learner.abstract_state(policy.params))
    checkpointer.close()
    if restored is not None:
      policy.params, step = restored["state"].params, int(restored["step"])
  return policy, step


def export_policy(policy: Policy, out_dir: str | os.PathLike) -> pathlib.Path:
  """Writes the policy as a HF folder (safetensors + config + tokenizer) that `model.base` and the PROPEL
  solver (`solver.model.base`) load."""
  from leap_jax.models.hf_io import save_hf_checkpoint  # pylint: disable=import-outside-toplevel
  save_hf_checkpoint(nnx.merge(policy.graphdef, policy.params), policy.tokenizer, out_dir)
  return pathlib.Path(out_dir)


def evaluate_checkpoint(cfg: ml_collections.ConfigDict, evaluator=None,
                        echo: Callable[[str], None] = print) -> dict[str, Any]:
  """Held-out Acc@1..Acc@T of the latest RL checkpoint in the workdir (else the starting policy).

  Writes `<workdir>/heldout_eval.json` and returns the result with the evaluated "step" (0 = no RL).
  """
  policy, step = latest_policy(cfg)
  own = evaluator is None
  evaluator = make_evaluator(cfg) if own else evaluator
  tasks = select_tasks(cfg.tasks.lang, cfg.heldout.levels, cfg.heldout.split)
  echo(f"held-out evaluation of step {step} on {len(tasks)} tasks, {cfg.heldout.num_turns} turns")
  result = heldout_accuracy(cfg, policy, evaluator, tasks, cfg.heldout.num_turns)
  if own:
    evaluator.close()
  result["step"] = step
  workdir(cfg).mkdir(parents=True, exist_ok=True)
  with open(workdir(cfg) / "heldout_eval.json", "w") as f:
    json.dump(result, f, indent=2)
  return result
