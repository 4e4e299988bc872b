"""The typed run config: frozen dataclasses, one per section of the `get_config()` files in configs/.

`launch/` turns the ml_collections ConfigDict into a `TrainConfig` once (`TrainConfig.from_dict(d.to_dict())`):
every field is checked on creation, sentinels are resolved (`dcp.t_min = -1` becomes G/2, `dcp.t_max = -2`
becomes G - 1, `sft.checkpoint_dir = ""` becomes `<workdir>/sft`, `evaluator.timeout_s = 0` becomes None) and
rules across fields are checked before anything is built, each error naming the fields. Library functions
take the section they use, never the whole config.
"""
from __future__ import annotations

import dataclasses
import os
import typing
from typing import Any, Mapping

from leap_jax.rollout import methods as methods_lib
from leap_jax.rollout.harness import RolloutSettings
from leap_jax.train.learner import LearnerConfig
from leap_jax.train.optim import OptimConfig

LANGS = ("pallas", "cuda")
ISOLATIONS = ("namespaces", "process")


def from_mapping(cls: type, values: Mapping[str, Any], path: str = "", **extra: Any) -> Any:
  """Builds dataclass `cls` from a nested mapping, recursing into dataclass-typed fields.

  Unknown keys and missing fields without a default are errors naming `<path>.<field>`; lists become
  tuples where the field is a tuple; `extra` fills fields the mapping does not hold.
  """
  if not isinstance(values, Mapping):
    raise TypeError(f"config section {path or cls.__name__!r} must be a mapping, got {type(values).__name__}")
  hints = typing.get_type_hints(cls)
  fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
  unknown = sorted(set(values) - set(fields))
  if unknown:
    raise ValueError(f"unknown config field(s) {[_join(path, k) for k in unknown]}")
  both = sorted(set(values) & set(extra))
  if both:
    raise ValueError(f"config field(s) {[_join(path, k) for k in both]} given twice")
  kwargs = dict(extra)
  for name, value in values.items():
    kwargs[name] = _convert(hints[name], value, _join(path, name))
  missing = [_join(path, n) for n, f in fields.items() if n not in kwargs and _no_default(f)]
  if missing:
    raise ValueError(f"missing config field(s) {missing}")
  return cls(**kwargs)


def _join(path: str, name: str) -> str:
  return f"{path}.{name}" if path else name


def _no_default(f: dataclasses.Field) -> bool:
  return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _convert(hint: Any, value: Any, path: str) -> Any:
  if dataclasses.is_dataclass(hint):
    return from_mapping(hint, value, path)
  origin = typing.get_origin(hint)
  if origin is tuple:
    if not isinstance(value, (list, tuple)):
      raise TypeError(f"config field {path!r} must be a sequence, got {value!r}")
    return tuple(value)
  if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
    raise TypeError(f"config field {path!r} must be an int, got {value!r}")
  if hint is float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise TypeError(f"config field {path!r} must be a number, got {value!r}")
    return float(value)
  if hint is bool and not isinstance(value, bool):
    raise TypeError(f"config field {path!r} must be a bool, got {value!r}")
  if hint is str and not isinstance(value, str):
    raise TypeError(f"config field {path!r} must be a string, got {value!r}")
  return dict(value) if dict in (hint, origin) else value


def pop_shared_sections(d: dict[str, Any]) -> dict[str, Any]:
  """Pops and types the sections LEAP and PROPEL configs share that need more than `from_mapping`: `optim`,
  `learner` (which takes `optim.grad_accum_steps`) and `evaluator` (timeout 0 means the backend's default)."""
  optim = from_mapping(OptimConfig, d.pop("optim"), "optim")
  learner = from_mapping(LearnerConfig, d.pop("learner"), "learner", grad_accum_steps=optim.grad_accum_steps)
  evaluator = dict(d.pop("evaluator"))
  evaluator["timeout_s"] = evaluator.get("timeout_s") or None
  return {"optim": optim, "learner": learner, "evaluator": from_mapping(EvaluatorConfig, evaluator, "evaluator")}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """Which model to load and how (section `model`): an embedded name, HF folder, .gguf file or "random"."""
  base: str
  arch: dict = dataclasses.field(default_factory=dict)  # HF config.json dict: random init and dry runs
  tokenizer: str = ""  # tokenizer source when base = "random"
  dtype: str = "float32"
  param_dtype: str = "float32"
  scan_layers: bool = True
  remat: str = "full"

  def __post_init__(self):
    if self.base == "random" and not (self.arch and self.tokenizer):
      raise ValueError("model.base = 'random' needs model.arch (a HF config dict) and model.tokenizer")

  @property
  def model_id(self) -> str:
    return self.base if self.base != "random" else f"random-{self.arch.get('hidden_size')}"


@dataclasses.dataclass(frozen=True)
class TasksConfig:
  """The RL task pool (section `tasks`)."""
  lang: str = "pallas"
  levels: tuple[int, ...] = (0, 1)
  split: str = "train"
  ids: tuple[str, ...] = ()
  folder: str = ""
  kernelbench_dir: str = ""  # a local KernelBench clone: levels, ids and split then select its problems
  kernelbench_tolerance: float = 1e-2

  def __post_init__(self):
    if self.lang not in LANGS:
      raise ValueError(f"tasks.lang {self.lang!r} is not one of {LANGS}")
    if not self.levels:
      raise ValueError("tasks.levels is empty")
    if self.kernelbench_dir and self.folder:
      raise ValueError("tasks.kernelbench_dir and tasks.folder are both set; choose one task source")
    if not 0 < self.kernelbench_tolerance < 1:
      raise ValueError(f"tasks.kernelbench_tolerance {self.kernelbench_tolerance} must be in (0, 1)")


@dataclasses.dataclass(frozen=True)
class RolloutConfig(RolloutSettings):
  """`RolloutSettings` plus the sampler's KV-cache slots per episode (section `rollout`)."""
  max_context_len: int = 3072

  def __post_init__(self):
    super().__post_init__()
    if self.max_new_tokens >= self.max_context_len:
      raise ValueError(f"rollout.max_new_tokens ({self.max_new_tokens}) must be below rollout.max_context_len "
                       f"({self.max_context_len})")


@dataclasses.dataclass(frozen=True)
class DcpConfig:
  """DCP's gate as failure counts out of G, resolved (see `methods.dcp_thresholds` for the sentinels)."""
  t_min: int
  t_max: int


def _dcp_thresholds(group_size: int, dcp: Mapping[str, Any]) -> tuple[int, int]:
  unknown = sorted(set(dcp) - {"t_min", "t_max"})
  if unknown:
    raise ValueError(f"unknown config field(s) {['dcp.' + k for k in unknown]}")
  try:
    t_min, t_max = methods_lib.dcp_thresholds(group_size, dcp.get("t_min"), dcp.get("t_max"))
  except ValueError as e:
    raise ValueError(f"dcp.t_min / dcp.t_max with rollout.group_size = {group_size}: {e}") from e
  if not 0 <= t_min <= t_max <= group_size:
    raise ValueError(f"dcp.t_min / dcp.t_max resolve to {t_min} / {t_max} failures, outside 0..rollout.group_size "
                     f"= {group_size}")
  return t_min, t_max


@dataclasses.dataclass(frozen=True)
class EvaluatorConfig:
  """Section `evaluator`; `timeout_s` None means the backend's default."""
  workers: int = 2
  timeout_s: float | None = None
  isolation: str = "namespaces"

  def __post_init__(self):
    if self.workers < 1:
      raise ValueError(f"evaluator.workers must be >= 1, got {self.workers}")
    if self.isolation not in ISOLATIONS:
      raise ValueError(f"evaluator.isolation {self.isolation!r} is not one of {ISOLATIONS}")


@dataclasses.dataclass(frozen=True)
class SftConfig:
  """Cold-start SFT (section `sft`); `checkpoint_dir` resolved to `<workdir>/sft` when unset."""
  enabled: bool
  checkpoint_dir: str
  levels: tuple[int, ...]
  extra_ids: tuple[str, ...]
  exclude_ids: tuple[str, ...]
  steps: int
  batch_size: int
  prompt_grad: bool
  optim: OptimConfig

  @property
  def start_dir(self) -> str | None:
    """The SFT checkpoint RL starts from, None when SFT is off (RL starts from the base model)."""
    return self.checkpoint_dir if self.enabled else None


@dataclasses.dataclass(frozen=True)
class PrecheckConfig:
  enabled: bool = True
  samples_per_task: int = 1
  after: bool = True

  def __post_init__(self):
    if self.samples_per_task < 1:
      raise ValueError(f"precheck.samples_per_task must be >= 1, got {self.samples_per_task}")


@dataclasses.dataclass(frozen=True)
class HeldoutConfig:
  split: str = "eval"
  levels: tuple[int, ...] = (0, 1)
  num_turns: int = 3
  at_end: bool = True
  every: int = 2
  temperature: float = 0.0
  samples: int = 1

  def __post_init__(self):
    if self.num_turns < 1 or self.every < 0 or self.temperature < 0:
      raise ValueError(f"heldout.num_turns must be >= 1, heldout.every and heldout.temperature >= 0, got "
                       f"{self.num_turns}, {self.every}, {self.temperature}")
    if self.samples < 1 or (self.samples > 1 and self.temperature == 0):
      raise ValueError(f"heldout.samples must be >= 1, and 1 at heldout.temperature = 0 (greedy trajectories are "
                       f"identical), got samples {self.samples} at temperature {self.temperature}")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  enabled: bool = False
  data: int = 1
  fsdp: int = -1
  tensor: int = 1


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  enabled: bool = False
  coordinator_address: str = ""
  num_processes: int = 1
  process_id: int = 0

  def __post_init__(self):
    if self.enabled and not 0 <= self.process_id < self.num_processes:
      raise ValueError(f"distributed.process_id ({self.process_id}) must be in [0, distributed.num_processes "
                       f"= {self.num_processes})")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  every: int = 50
  keep: int = 3
  async_save: bool = True
  export_hf: bool = True

  def __post_init__(self):
    if self.every < 1 or self.keep < 1:
      raise ValueError(f"checkpoint.every and checkpoint.keep must be >= 1, got {self.every}, {self.keep}")


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
  tensorboard: bool = True
  progress_bar: bool = True
  episode_dumps: bool = True
  episode_dump_every: int = 10
  episodes_per_dump: int = 16
  plot_at_end: bool = True


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """A LEAP run (configs/default.py and the configs built on it)."""
  seed: int
  workdir: str
  method: str
  steps: int
  model: ModelSpec
  tasks: TasksConfig
  rollout: RolloutConfig
  dcp: DcpConfig
  evaluator: EvaluatorConfig
  sft: SftConfig
  precheck: PrecheckConfig
  heldout: HeldoutConfig
  mesh: MeshConfig
  distributed: DistributedConfig
  optim: OptimConfig
  learner: LearnerConfig
  checkpoint: CheckpointConfig
  metrics: MetricsConfig

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "TrainConfig":
    """The typed config of a `get_config().to_dict()`, sentinels resolved, cross-field rules checked."""
    d = dict(d)
    methods_lib.get_method(d.get("method", ""))
    rollout = from_mapping(RolloutConfig, d.pop("rollout"), "rollout")
    dcp = d.pop("dcp")
    t_min, t_max = _dcp_thresholds(rollout.group_size, dcp)
    shared = pop_shared_sections(d)
    sft = dict(d.pop("sft"))
    sft["checkpoint_dir"] = sft.get("checkpoint_dir") or os.path.join(d["workdir"], "sft")
    config = from_mapping(cls, {**d, "sft": sft}, rollout=rollout, dcp=DcpConfig(t_min, t_max), **shared)
    config.check()
    return config

  def check(self) -> None:
    """Rules across sections."""
    if self.steps < 0:
      raise ValueError(f"steps must be >= 0, got {self.steps}")
    if self.distributed.enabled and self.rollout.num_problems % self.distributed.num_processes:
      raise ValueError(f"rollout.num_problems ({self.rollout.num_problems}) must be a multiple of "
                       f"distributed.num_processes ({self.distributed.num_processes})")

  def to_dict(self) -> dict[str, Any]:
    """JSON-able (checkpoints and run records)."""
    return dataclasses.asdict(self)
