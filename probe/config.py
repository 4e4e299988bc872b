"""PROPEL's typed config: frozen dataclasses, one per section of configs/propel_cpu.py and propel_h200.py.

`launch/` builds it once with `PropelConfig.from_dict(get_config().to_dict())`; sentinels are resolved there
(`corpus.dir = ""` becomes `<workdir>/corpus`, `rl.export_dir = ""` becomes `<workdir>/generated_tasks`,
`evaluator.timeout_s = 0` becomes None).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

from leap_jax.train.config import (CheckpointConfig, EvaluatorConfig, MetricsConfig, ModelSpec, from_mapping,
                                   pop_shared_sections)
from leap_jax.train.learner import LearnerConfig
from leap_jax.train.optim import OptimConfig

SCALES = ("smoke", "paper")


@dataclasses.dataclass(frozen=True)
class GeneratorSftConfig:
  enabled: bool
  steps: int
  batch_size: int
  per_task: int
  optim: OptimConfig


@dataclasses.dataclass(frozen=True)
class GeneratorConfig:
  """The frozen reference generator (also the RL start point) and how it samples."""
  model: ModelSpec
  levels: tuple[int, ...]
  num_shots: int
  max_new_tokens: int
  max_context_len: int
  temperature: float
  top_p: float
  batch_size: int
  sft: GeneratorSftConfig


@dataclasses.dataclass(frozen=True)
class SolverConfig:
  """The solver whose K attempts label a generated task."""
  model: ModelSpec
  attempts: int
  episode_mode: bool
  num_turns: int
  temperature: float
  top_p: float
  max_new_tokens: int
  max_context_len: int
  context: str


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
  num_tasks: int
  band: tuple[int, ...]
  dir: str

  def __post_init__(self):
    if len(self.band) != 2 or not 0 <= self.band[0] <= self.band[1]:
      raise ValueError(f"corpus.band must be (a, b) with 0 <= a <= b, got {self.band}")


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
  layers: tuple[int, ...]
  l2s: tuple[float, ...]
  hidden: int
  steps: int
  cv_folds: int
  cv_groups: str
  alpha: float
  allow_ineligible: bool
  rvp_samples: int
  r_bad: float
  max_tokens: int
  second_probe: str


@dataclasses.dataclass(frozen=True)
class RlConfig:
  steps: int
  num_prompts: int
  group_size: int
  audit_every: int
  audit_tasks: int
  export_dir: str

  def __post_init__(self):
    if self.audit_every < 1:
      raise ValueError(f"rl.audit_every must be >= 1, got {self.audit_every}")


@dataclasses.dataclass(frozen=True)
class PropelConfig:
  seed: int
  scale: str
  workdir: str
  lang: str
  generator: GeneratorConfig
  solver: SolverConfig
  evaluator: EvaluatorConfig
  corpus: CorpusConfig
  probe: ProbeConfig
  rl: RlConfig
  optim: OptimConfig
  learner: LearnerConfig
  checkpoint: CheckpointConfig
  metrics: MetricsConfig

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "PropelConfig":
    d = dict(d)
    shared = pop_shared_sections(d)
    corpus = {**d.pop("corpus")}
    corpus["dir"] = corpus.get("dir") or os.path.join(d["workdir"], "corpus")
    rl = {**d.pop("rl")}
    rl["export_dir"] = rl.get("export_dir") or os.path.join(d["workdir"], "generated_tasks")
    config = from_mapping(cls, {**d, "corpus": corpus, "rl": rl}, **shared)
    if config.scale not in SCALES:
      raise ValueError(f"scale {config.scale!r} is not one of {SCALES}")
    return config

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @property
  def scale_note(self) -> str:
    if self.scale == "smoke":
      return "[smoke-scale result: CPU sizes, not comparable to the paper's numbers]"
    return "[paper-scale sizes]"
