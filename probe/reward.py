"""The generator's probe reward.

  r(task) = min_j (probe_j(f(task)) - shift_j) / scale_j   if the task is valid,   r_bad otherwise,

with f the pooled reference-model activations of the rendered task (`activations`), one probe (or two, for
the worst-case option), and each probe's reward scale (`linear.with_reward_scale`: its logits standardised over
the reference generator's valid tasks, so r_bad is in the same units for every probe; a probe without a scale
gives raw logits, and `launch/train_generator.py` refuses such a probe).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from probe import activations as activations_lib
from probe import linear


class ProbeReward:
  """Scores checked generations (`generator.GeneratedTask`) with the probe(s).

  Args:
    extractor: `ActivationExtractor` of the frozen reference model at the probe's layer.
    probes: one ProbeParams, or two for the worst-case reward.
    lang: the language the task text is rendered for.
    r_bad: reward of an invalid generation.
  """

  def __init__(self, extractor: activations_lib.ActivationExtractor, probes: Sequence[linear.ProbeParams], *,
               lang: str = "pallas", r_bad: float = -0.2):
    if not probes:
      raise ValueError("ProbeReward needs at least one probe")
    self.extractor = extractor
    self.probes = list(probes)
    self.lang = lang
    self.r_bad = float(r_bad)

  def logits(self, tasks) -> np.ndarray:
    """f32[n] worst-case reward-scale probe logit of parsed tasks."""
    feats = self.extractor([activations_lib.task_text(t, self.lang) for t in tasks])
    return np.min(np.stack([np.asarray(linear.probe_reward_logits(p, feats)) for p in self.probes]), axis=0)

  def __call__(self, checked) -> np.ndarray:
    """f32[n] rewards of checked generations."""
    rewards = np.full(len(checked), self.r_bad, np.float32)
    valid = [i for i, c in enumerate(checked) if c.valid]
    if valid:
      rewards[valid] = self.logits([checked[i].task for i in valid])
    return rewards
