"""Training methods: who gets another turn, how turns are scored, and how credit becomes [P,G,T].

| method | keep rule (who gets turn t+1) | per-turn score | gamma | advantage | [P,G] -> [P,G,T] |
|---|---|---|---|---|---|
| `leap` | DCP: groups with t_min <= N_fail(turn 1) <= t_max expand; their unsolved valid samples continue until a pass (defaults t_min = G/2, t_max = G) | first-pass turn (level) | 1.0 | rank reward over levels (`rank_reward`) | `turn_advantages`: A>0 flows back to turns <= first pass with gamma^(k-t); A<=0 on every kept turn |
| `leap_no_dcp` | every unsolved valid sample continues until a pass or turn T | first-pass turn (level) | 1.0 | rank reward | `turn_advantages` as `leap` |
| `grpo` | one turn only | 1[correct] | - | `grpo_advantages` (group mean/std) | turn 1 only |
| `grpo_mt` | every unsolved valid sample continues until a pass or turn T | 1[correct at any kept turn] | - | `grpo_advantages` | the same value on every kept turn |
| `kevin` | every valid sample gets all T turns, also after a pass | 0.3*1[correct] + min(speedup, 10) (speedup only where timed and correct; without timings it is 0.3*1[correct]) | 0.4 | `kevin_returns`, normalised over all kept turn samples of the task | per turn (returns are per turn) |
| `trloo` | every unsolved valid sample continues until a pass or turn T | 0.5*1[correct] + 0.5*min(speedup, 3) where timed and correct (Dr. Kernel; its profiling terms are left out) | 1.0 | `trloo_advantages` on `kevin_returns(gamma=1)` | per turn (leave-one-out baseline per turn index) |

Success is status `correct` only (`EvalResult.success`); `not_run` never succeeds. A speedup the
evaluator flags `suspicious_speedup` (above 10x) counts as not timed: it adds nothing to any score. Samples with
an evaluator infrastructure error after retries are invalid: they have no kept turns, count in
no group statistic and get zero advantage.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from leap_jax import rewards

KEEP_RULES = ("dcp", "until_solved", "single_turn", "all_turns")


@dataclasses.dataclass(frozen=True)
class Method:
  """One row of the method table (see the module docstring for the equations)."""
  name: str
  keep_rule: str
  turn_score: str
  gamma: float | None
  advantage: str
  broadcast: str

  @property
  def timed_score(self) -> bool:
    """Whether the per-turn score uses measured speedups (degenerates to correctness without timings)."""
    return self.name in ("kevin", "trloo")


METHODS = {m.name: m for m in (
    Method("leap", "dcp", "first-pass turn (level)", 1.0, "rank_reward", "turn_advantages"),
    Method("leap_no_dcp", "until_solved", "first-pass turn (level)", 1.0, "rank_reward", "turn_advantages"),
    Method("grpo", "single_turn", "1[correct]", None, "grpo_advantages", "turn 1 only"),
    Method("grpo_mt", "until_solved", "1[correct at any kept turn]", None, "grpo_advantages",
           "same value on every kept turn"),
    Method("kevin", "all_turns", "0.3*1[correct] + min(speedup, 10) where timed", 0.4,
           "kevin_returns normalised per task", "per turn"),
    Method("trloo", "until_solved", "0.5*1[correct] + 0.5*min(speedup, 3) where timed", 1.0,
           "trloo_advantages(kevin_returns(gamma=1))", "per turn"),
)}

KEVIN_CORRECT_WEIGHT = 0.3
KEVIN_SPEEDUP_CAP = 10.0   # kernels_eval flags anything faster as suspicious and the harness voids it
TRLOO_CORRECT_WEIGHT = 0.5  # Dr. Kernel: 0.5*1[correct] + 0.5*min(speedup, 3)
TRLOO_SPEEDUP_WEIGHT = 0.5
TRLOO_SPEEDUP_CAP = 3.0


def get_method(name: str) -> Method:
  if name not in METHODS:
    raise ValueError(f"unknown method {name!r}; choose one of {sorted(METHODS)}")
  return METHODS[name]


def max_turns(method: Method, num_turns: int) -> int:
  """Turns a rollout of `method` may use: 1 for single-turn GRPO, else the configured T."""
  return 1 if method.keep_rule == "single_turn" else num_turns


def dcp_thresholds(group_size: int, t_min: int | None, t_max: int | None) -> tuple[int, int]:
  """(t_min, t_max) as failure counts. t_min unset (None or < 0): G/2 rounded up (LEAP). t_max unset (None):
  G; negative: counted back from G (-1 = G, LEAP's reading; -2 = G - 1, which also prunes all-fail groups)."""
  lo = -(-group_size // 2) if t_min is None or t_min < 0 else int(t_min)
  hi = group_size if t_max is None else (group_size + 1 + int(t_max) if t_max < 0 else int(t_max))
  if lo > hi:
    raise ValueError(f"DCP thresholds t_min={lo} > t_max={hi}: no group could expand")
  return lo, hi


def group_active(method: Method, first_turn_success: np.ndarray, valid: np.ndarray,
                 t_min: int, t_max: int) -> np.ndarray:
  """bool[P]: groups allowed past turn 1 (the DCP gate for `leap`, all groups otherwise)."""
  if method.keep_rule == "dcp":
    active, _ = rewards.dcp_gate(jnp.asarray(first_turn_success), t_min, t_max, jnp.asarray(valid))
    return np.asarray(active)
  return np.full(first_turn_success.shape[0], method.keep_rule != "single_turn")


def next_turn(method: Method, solved_so_far: np.ndarray, active: np.ndarray, valid: np.ndarray) -> np.ndarray:
  """bool[P,G]: samples that get the next turn.

  Args:
    solved_so_far: bool[P,G], passed at some turn so far.
    active: bool[P], from `group_active`.
    valid: bool[P,G], no infrastructure error so far.
  """
  if method.keep_rule == "single_turn":
    return np.zeros_like(solved_so_far)
  if method.keep_rule == "all_turns":
    return valid & active[:, None]
  return np.asarray(rewards.dcp_next_turn(jnp.asarray(solved_so_far), jnp.asarray(active), jnp.asarray(valid)))


class Credit(NamedTuple):
  """Per-method rewards of one rollout.

  advantages: float32[P,G,T], 0 where not kept.
  reward: float32[P,G], the trajectory reward (rank reward, binary pass, or the mean kept-turn score).
  level: int32[P,G], first passing kept turn, T+1 if none.
  """
  advantages: np.ndarray
  reward: np.ndarray
  level: np.ndarray


def turn_scores(method: Method, success: np.ndarray, speedup: np.ndarray) -> np.ndarray:
  """float32[P,G,T] per-turn score of `kevin` / `trloo`.

  The speedup counts only where timed (not NaN; a speedup the evaluator flagged as suspicious arrives as
  NaN) and correct, and never above the method's cap (`KEVIN_SPEEDUP_CAP`, `TRLOO_SPEEDUP_CAP`).
  """
  timed = np.isfinite(speedup) & success
  correct = success.astype(np.float32)
  if method.name == "kevin":
    return KEVIN_CORRECT_WEIGHT * correct + np.where(timed, np.minimum(speedup, KEVIN_SPEEDUP_CAP), 0.0).astype(
        np.float32)
  speed = np.where(timed, np.minimum(speedup, TRLOO_SPEEDUP_CAP), 0.0)
  return (TRLOO_CORRECT_WEIGHT * correct + TRLOO_SPEEDUP_WEIGHT * speed).astype(np.float32)


def normalise_per_task(values: np.ndarray, keep: np.ndarray, eps: float = 1e-6) -> np.ndarray:
  """(v − mean) / (std + eps) over the kept [G,T] entries of each task; 0 where not kept or fewer than 2 kept."""
  n = keep.sum(axis=(1, 2), keepdims=True)
  mean = np.where(keep, values, 0.0).sum(axis=(1, 2), keepdims=True) / np.maximum(n, 1)
  centred = np.where(keep, values - mean, 0.0)
  std = np.sqrt((centred ** 2).sum(axis=(1, 2), keepdims=True) / np.maximum(n - 1, 1))
  return np.where(keep & (n >= 2), centred / (std + eps), 0.0).astype(np.float32)


def credit(method: Method, success: np.ndarray, keep: np.ndarray, valid: np.ndarray,
           speedup: np.ndarray) -> Credit:
  """Advantages of one rollout under `method`.

  Args:
    success: bool[P,G,T], read only where kept.
    keep: bool[P,G,T], turns that were generated and evaluated (false for invalid samples).
    valid: bool[P,G].
    speedup: float32[P,G,T], NaN where not timed.
  """
  success = np.asarray(success, bool) & keep
  keep = np.asarray(keep, bool) & valid[..., None]
  level = np.asarray(rewards.first_pass_turn(jnp.asarray(success), jnp.asarray(keep)))
  if method.advantage == "rank_reward":
    reward = np.asarray(rewards.rank_reward(jnp.asarray(level), jnp.asarray(valid)))
    adv = rewards.turn_advantages(jnp.asarray(reward), jnp.asarray(level), jnp.asarray(keep), method.gamma)
  elif method.advantage == "grpo_advantages":
    reward = np.asarray(rewards.any_turn_success_reward(jnp.asarray(success), jnp.asarray(keep)))
    group = rewards.grpo_advantages(jnp.asarray(reward), jnp.asarray(valid))
    adv = jnp.where(jnp.asarray(keep), group[..., None], 0.0)
  else:
    scores = turn_scores(method, success, np.asarray(speedup, np.float32))
    returns = np.asarray(rewards.kevin_returns(jnp.asarray(scores), jnp.asarray(keep), method.gamma))
    if method.name == "kevin":
      adv = normalise_per_task(returns, keep)
    else:
      adv = rewards.trloo_advantages(jnp.asarray(returns), jnp.asarray(keep))
    reward = (np.where(keep, scores, 0.0).sum(-1) / np.maximum(keep.sum(-1), 1)).astype(np.float32)
  return Credit(np.asarray(adv, np.float32), np.asarray(reward, np.float32), level.astype(np.int32))


def table_markdown() -> str:
  """The method table of the module docstring (for the README)."""
  lines = __doc__.splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith("| method"))
  end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
  return "\n".join(lines[start:end])
