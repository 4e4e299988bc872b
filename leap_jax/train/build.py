"""Building the parts of a run from their config sections: models and tokenizers, the policy, task pools,
the evaluator, the mesh and rollouts."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import kernels_eval
from kernels_eval.kernelbench.tasks import load_tasks as kernelbench_load
from leap_jax.models import ModelConfig, Transformer
from leap_jax.models import pretrained
from leap_jax.models import sharding as model_sharding
from leap_jax.models.gguf_io import gguf_tokenizer
from leap_jax.models.hf_io import load_tokenizer
from leap_jax.rollout import methods as methods_lib
from leap_jax.rollout.harness import Rollout, RolloutSettings
from leap_jax.sampling import ChatFormat, Sampler
from leap_jax.train import optim
from leap_jax.train.batch import round_up
from leap_jax.train.config import (DcpConfig, EvaluatorConfig, HeldoutConfig, MeshConfig, ModelSpec, TasksConfig,
                                   TrainConfig)
from leap_jax.train.learner import Learner, row_multiple


def load_tokenizer_from(source: str):
  """The tokenizer of an embedded model name or a HF folder."""
  if source in pretrained.EMBEDDED:
    import gguf  # pylint: disable=import-outside-toplevel
    return gguf_tokenizer(gguf.GGUFReader(pretrained.embedded_gguf_path(source)))
  if os.path.isdir(source):
    return load_tokenizer(source)
  raise FileNotFoundError(f"model.tokenizer {source!r} is neither an embedded model {sorted(pretrained.EMBEDDED)} "
                          "nor a folder")


def model_config(spec: ModelSpec) -> ModelConfig:
  """The architecture from `spec.base`'s config.json when it is a folder, else from `spec.arch`."""
  kw = dict(dtype=spec.dtype, param_dtype=spec.param_dtype, scan_layers=spec.scan_layers, remat=spec.remat)
  if os.path.isfile(os.path.join(spec.base, "config.json")):
    return ModelConfig.from_hf_config(spec.base, **kw)
  return ModelConfig.from_hf_config(dict(spec.arch), **kw)


def load_model(spec: ModelSpec, seed: int, mesh=None) -> tuple[Transformer, Any]:
  """(model, tokenizer) of `spec.base`: embedded name, HF folder, .gguf, or "random" from `spec.arch`."""
  if spec.base == "random":
    return Transformer(model_config(spec), rngs=nnx.Rngs(seed)), load_tokenizer_from(spec.tokenizer)
  return pretrained.load_pretrained(spec.base, dtype=spec.dtype, param_dtype=spec.param_dtype,
                                    scan_layers=spec.scan_layers, remat=spec.remat, mesh=mesh)


def has_checkpoint(folder: str | os.PathLike) -> bool:
  """Whether `folder` holds a HF checkpoint (its config.json)."""
  return (pathlib.Path(folder) / "config.json").is_file()


def load_start_policy(spec: ModelSpec, sft_dir: str | None, seed: int, mesh=None) -> tuple[Transformer, Any]:
  """The policy RL starts from: the SFT checkpoint in `sft_dir` when given, else the base model."""
  if sft_dir is None:
    return load_model(spec, seed, mesh)
  if not has_checkpoint(sft_dir):
    raise FileNotFoundError(f"sft.enabled but no SFT checkpoint in {sft_dir}; run launch/sft.py first "
                            "(launch/train.py does this automatically)")
  return load_model(dataclasses.replace(spec, base=str(sft_dir)), seed, mesh)


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


def kernelbench_tasks(tasks: TasksConfig, split: str, evaluator=None,
                      echo=print) -> list[kernels_eval.Task]:
  """The problems of the KernelBench clone `tasks.kernelbench_dir` at `tasks.levels` (only `tasks.ids` when
  given) in `split` (by id hash: `kernels_eval.kernelbench.problems.split_of`), each described by its
  reference in the sandbox (`evaluator`, else a transient one); problems that do not load are echoed."""
  with contextlib.ExitStack() as stack:
    if evaluator is None:
      evaluator = stack.enter_context(kernels_eval.Evaluator())
    loaded, skipped = kernelbench_load(tasks.kernelbench_dir, evaluator, levels=tasks.levels, ids=tasks.ids,
                                       split=split, tolerance=tasks.kernelbench_tolerance)
  for where, why in skipped.items():
    echo(f"KernelBench: skipped {where}: {why[:300]}")
  if not loaded:
    raise ValueError(f"no KernelBench problems load from {tasks.kernelbench_dir} with split={split!r} "
                     f"levels={tuple(tasks.levels)} ids={tuple(tasks.ids)}")
  return loaded


def heldout_tasks(tasks: TasksConfig, heldout: HeldoutConfig, evaluator=None,
                  echo=print) -> list[kernels_eval.Task]:
  """The held-out tasks: with `tasks.kernelbench_dir`, that clone's eval split at `tasks.levels`, every id
  (`tasks.ids` picks train problems; `heldout.split` and `heldout.levels` describe the embedded suite);
  otherwise the embedded suite's `heldout.split` at `heldout.levels`."""
  if tasks.kernelbench_dir:
    return kernelbench_tasks(dataclasses.replace(tasks, ids=()), "eval", evaluator, echo)
  return select_tasks(tasks.lang, heldout.levels, heldout.split)


def pool_tasks(tasks: TasksConfig) -> list[kernels_eval.Task]:
  """The RL task pool of section `tasks`: KernelBench problems when `kernelbench_dir` is set."""
  if tasks.kernelbench_dir:
    return kernelbench_tasks(tasks, tasks.split)
  return select_tasks(tasks.lang, tasks.levels, tasks.split, tasks.ids, tasks.folder)


def make_evaluator(config: EvaluatorConfig) -> kernels_eval.Evaluator:
  """The sandboxed evaluator; use it as a context manager so its workers stop on every exit path."""
  return kernels_eval.Evaluator(workers=config.workers, timeout_s=config.timeout_s, isolation=config.isolation)


def make_mesh(config: MeshConfig):
  """The ("data", "fsdp", "tensor") mesh, or None when sharding is off."""
  if not config.enabled:
    return None
  return model_sharding.make_mesh(config.data, config.fsdp, config.tensor)


@dataclasses.dataclass(frozen=True)
class Rollouts:
  """Makes `Rollout`s that share the run's settings, DCP thresholds, language and seed."""
  settings: RolloutSettings
  dcp: DcpConfig
  lang: str
  seed: int

  @classmethod
  def of(cls, config: TrainConfig) -> "Rollouts":
    return cls(config.rollout, config.dcp, config.tasks.lang, config.seed)

  def make(self, policy: Policy, evaluator, method: methods_lib.Method, sampler=None, **overrides) -> Rollout:
    """A rollout of `method` (settings replaced by `overrides`) sampled by `sampler` (default: the policy's)."""
    settings = dataclasses.replace(self.settings, **overrides)
    dcp = (self.dcp.t_min, self.dcp.t_max) if method.uses_dcp else (0, settings.group_size)
    return Rollout(sampler or policy.sampler, policy.chat, evaluator, method=method, settings=settings,
                   lang=self.lang, seed=self.seed, dcp=dcp)


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


def dry_run(config: TrainConfig) -> dict[str, Any]:
  """Builds the model abstractly (nnx.eval_shape), the mesh, the learner state and batch shapes; allocates nothing.

  Returns a summary: parameter count, mesh shape, train-state bytes, batch shape, task counts.
  """
  model_cfg = model_config(config.model)
  abstract_model = nnx.eval_shape(lambda: Transformer(model_cfg, rngs=nnx.Rngs(0)))
  graphdef, abstract_params = nnx.split(abstract_model)
  mesh = make_mesh(config.mesh)
  specs = model_sharding.partition_specs(abstract_params, mesh) if mesh is not None else None
  learner = Learner.for_model(graphdef, optim.make_optimizer(config.optim), config.learner, mesh=mesh)
  state = learner.abstract_state(abstract_params, specs)
  multiple = row_multiple(config.learner, mesh)
  rows = round_up(config.rollout.num_problems * config.rollout.group_size, multiple)
  leaves = jax.tree.leaves(abstract_params)
  return {
      "params": int(sum(np.prod(x.shape) for x in leaves)),
      "state_bytes": int(sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(state))),
      "mesh": None if mesh is None else dict(mesh.shape),
      "batch": (rows, config.rollout.max_context_len),
      "tasks": len(pool_tasks(config.tasks)),
      "model": model_cfg,
  }
