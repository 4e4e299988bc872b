"""Training methods: who gets another turn, how turns are scored, and how credit becomes [P,G,T].

A method is a `Method` in the registry `METHODS`, built from callables: a keep rule (`KeepRule`: how many turns
a rollout may use, which groups go past turn 1, which samples get the next turn), a per-turn score where it has
one (`TurnScore`) and a credit estimator (`CreditFn`: success, keep, valid, speedup -> `Credit`). Keep rules,
scores and estimators are shared between methods. `table_markdown()` renders the method table from the
registry. A new method is one `register(Method(...))` call; `get_method(name)` looks it up.

Success is status `correct` only (`EvalResult.success`); `not_run` never succeeds. A speedup the
evaluator flags `suspicious_speedup` (above 10x) counts as not timed: it adds nothing to any score. Samples with
an evaluator infrastructure error after retries are invalid: they have no kept turns, count in
no group statistic and get zero advantage.

Shapes: P problems, G samples per group, T turns (index t=0 is turn 1).
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Callable, NamedTuple, Protocol

import jax.numpy as jnp
import numpy as np

from leap_jax import rewards

KEVIN_CORRECT_WEIGHT = 0.3
KEVIN_SPEEDUP_WEIGHT = 1.0
KEVIN_SPEEDUP_CAP = 10.0   # kernels_eval flags anything faster as suspicious and the harness voids it
TRLOO_CORRECT_WEIGHT = 0.5  # Dr. Kernel: 0.5*1[correct] + 0.5*min(speedup, 3)
TRLOO_SPEEDUP_WEIGHT = 0.5
TRLOO_SPEEDUP_CAP = 3.0

TABLE_HEADER = ("method", "keep rule (who gets turn t+1)", "per-turn score", "gamma", "advantage",
                "[P,G] -> [P,G,T]")


# Keep rules ---------------------------------------------------------------------------------------------------

class KeepRule(abc.ABC):
  """Who gets turn t+1. Subclasses set `text` (its cell in the method table) and define `next_turn`."""
  text: str
  uses_dcp: bool = False  # group_active reads the DCP thresholds

  def max_turns(self, num_turns: int) -> int:
    """Turns a rollout may use, given the configured T."""
    return num_turns

  def group_active(self, first_turn_success: np.ndarray, valid: np.ndarray, t_min: int,
                   t_max: int) -> np.ndarray:
    """bool[P]: groups allowed past turn 1 (all of them unless overridden).

    Args:
      first_turn_success: bool[P,G].
      valid: bool[P,G].
      t_min, t_max: DCP thresholds as failure counts (from `dcp_thresholds`).
    """
    del valid, t_min, t_max
    return np.full(first_turn_success.shape[0], True)

  @abc.abstractmethod
  def next_turn(self, solved_so_far: np.ndarray, active: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """bool[P,G]: samples that get the next turn.

    Args:
      solved_so_far: bool[P,G], passed at some turn so far.
      active: bool[P], from `group_active`.
      valid: bool[P,G], no infrastructure error so far.
    """


class UntilSolved(KeepRule):
  """next[p,g] = valid[p,g] ∧ active[p] ∧ ¬solved_so_far[p,g]   (a pass ends the trajectory)."""
  text = "every unsolved valid sample continues until a pass or turn T"

  def next_turn(self, solved_so_far, active, valid):
    return np.asarray(rewards.dcp_next_turn(jnp.asarray(solved_so_far), jnp.asarray(active), jnp.asarray(valid)))


class Dcp(UntilSolved):
  """`UntilSolved` inside the groups that pass the DCP gate (LEAP, arXiv 2608.01804).

    active[p] = t_min <= Σ_g valid[p,g]·(1 − s[p,g,1]) <= t_max
  """
  text = ("DCP: groups with t_min <= N_fail(turn 1) <= t_max expand; their unsolved valid samples continue until "
          "a pass (defaults t_min = G/2, t_max = G)")
  uses_dcp = True

  def group_active(self, first_turn_success, valid, t_min, t_max):
    active, _ = rewards.dcp_gate(jnp.asarray(first_turn_success), t_min, t_max, jnp.asarray(valid))
    return np.asarray(active)


class AllTurns(KeepRule):
  """next[p,g] = valid[p,g] ∧ active[p]   (also after a pass; Kevin)."""
  text = "every valid sample gets all T turns, also after a pass"

  def next_turn(self, solved_so_far, active, valid):
    del solved_so_far
    return valid & active[:, None]


class SingleTurn(KeepRule):
  """Turn 1 only: T = 1, no group is active, nobody gets a next turn."""
  text = "one turn only"

  def max_turns(self, num_turns):
    del num_turns
    return 1

  def group_active(self, first_turn_success, valid, t_min, t_max):
    del valid, t_min, t_max
    return np.full(first_turn_success.shape[0], False)

  def next_turn(self, solved_so_far, active, valid):
    del active, valid
    return np.zeros_like(solved_so_far)


UNTIL_SOLVED = UntilSolved()
DCP = Dcp()
ALL_TURNS = AllTurns()
SINGLE_TURN = SingleTurn()


# Per-turn scores ----------------------------------------------------------------------------------------------

class TurnScore(Protocol):
  """float32[P,G,T] score of each turn from success bool[P,G,T] and speedup float32[P,G,T] (NaN: not timed)."""

  @property
  def timed(self) -> bool:
    """Whether the score reads measured speedups (and degenerates to correctness without timings)."""

  def __call__(self, success: np.ndarray, speedup: np.ndarray) -> np.ndarray:
    ...


@dataclasses.dataclass(frozen=True)
class SpeedupScore:
  """Correctness plus a capped speedup where timed and correct (Kevin, arXiv 2507.11948; Dr. Kernel, 2602.05885).

    S[p,g,t] = w_c·1[s] + w_s·min(speedup, cap)·1[s ∧ isfinite(speedup)]

  A speedup the evaluator flagged as suspicious arrives as NaN and counts as not timed.
  """
  correct_weight: float
  speedup_weight: float
  cap: float

  @property
  def timed(self) -> bool:
    return self.speedup_weight != 0.0

  def __call__(self, success: np.ndarray, speedup: np.ndarray) -> np.ndarray:
    speedup = np.asarray(speedup, np.float32)
    speed = np.where(np.isfinite(speedup) & success, np.minimum(speedup, self.cap), 0.0)
    return (self.correct_weight * success.astype(np.float32) + self.speedup_weight * speed).astype(np.float32)


KEVIN_SCORE = SpeedupScore(KEVIN_CORRECT_WEIGHT, KEVIN_SPEEDUP_WEIGHT, KEVIN_SPEEDUP_CAP)
TRLOO_SCORE = SpeedupScore(TRLOO_CORRECT_WEIGHT, TRLOO_SPEEDUP_WEIGHT, TRLOO_SPEEDUP_CAP)


# Credit estimators --------------------------------------------------------------------------------------------

class Credit(NamedTuple):
  """Per-method rewards of one rollout.

  advantages: float32[P,G,T], 0 where not kept.
  reward: float32[P,G], the trajectory reward (rank reward, binary pass, or the mean kept-turn score).
  level: int32[P,G], first passing kept turn, T+1 if none.
  """
  advantages: np.ndarray
  reward: np.ndarray
  level: np.ndarray


# (success bool[P,G,T], keep bool[P,G,T], valid bool[P,G], speedup float32[P,G,T]) -> Credit. `credit` hands it
# success and keep already masked: success only where kept, keep only on valid samples.
CreditFn = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], Credit]


def _first_pass(success: np.ndarray, keep: np.ndarray) -> np.ndarray:
  """int32[P,G]: first passing kept turn, T+1 if none."""
  return np.asarray(rewards.first_pass_turn(jnp.asarray(success), jnp.asarray(keep)))


def _credit(advantages, reward, level) -> Credit:
  return Credit(np.asarray(advantages, np.float32), np.asarray(reward, np.float32), level.astype(np.int32))


@dataclasses.dataclass(frozen=True)
class RankCredit:
  """LEAP (arXiv 2608.01804): the rank reward of the first-pass turn, spread over the kept turns.

    level[p,g] = min{t : keep ∧ s},  T+1 if none
    r[p,g]     = Σ_{j valid} (1[level_j > level_g] − 1[level_j < level_g]) / (n_valid[p] − 1)
    A[p,g,t]   = gamma^(level−t)·r  for t <= level if r > 0 and level <= T,  else r;   0 where not kept
  """
  gamma: float

  def __call__(self, success, keep, valid, speedup) -> Credit:
    del speedup
    level = _first_pass(success, keep)
    reward = np.asarray(rewards.rank_reward(jnp.asarray(level), jnp.asarray(valid)))
    adv = rewards.turn_advantages(jnp.asarray(reward), jnp.asarray(level), jnp.asarray(keep), self.gamma)
    return _credit(adv, reward, level)


def grpo_credit(success, keep, valid, speedup) -> Credit:
  """GRPO / GRPO-MT: the group-normalised binary pass, the same value on every kept turn.

    r[p,g]   = 1[∃t : keep ∧ s]
    A[p,g,t] = keep[p,g,t] · (r[p,g] − μ_p) / (σ_p + eps),   μ, σ over the valid samples of group p
  """
  del speedup
  reward = np.asarray(rewards.any_turn_success_reward(jnp.asarray(success), jnp.asarray(keep)))
  group = rewards.grpo_advantages(jnp.asarray(reward), jnp.asarray(valid))
  adv = jnp.where(jnp.asarray(keep), group[..., None], 0.0)
  return _credit(adv, reward, _first_pass(success, keep))


@dataclasses.dataclass(frozen=True)
class ReturnsCredit:
  """Per-turn discounted returns of a per-turn score, turned into advantages by `advantage` (Kevin, TRLOO).

    S[p,g,t] = score(s, speedup)
    R[p,g,t] = Σ_{k>=t, keep[p,g,k]} gamma^(k−t) · S[p,g,k],   0 where not kept
    A[p,g,t] = advantage(R, keep)[p,g,t]
    r[p,g]   = Σ_{t kept} S[p,g,t] / max(n_kept[p,g], 1)

  `advantage` maps (R float32[P,G,T], keep bool[P,G,T]) to float[P,G,T], 0 where not kept.
  """
  score: TurnScore
  gamma: float
  advantage: Callable[[np.ndarray, np.ndarray], np.ndarray]

  def __call__(self, success, keep, valid, speedup) -> Credit:
    del valid  # invalid samples have no kept turns
    scores = self.score(success, speedup)
    returns = np.asarray(rewards.kevin_returns(jnp.asarray(scores), jnp.asarray(keep), self.gamma))
    reward = np.where(keep, scores, 0.0).sum(-1) / np.maximum(keep.sum(-1), 1)
    return _credit(self.advantage(returns, keep), reward, _first_pass(success, keep))


def normalise_per_task(values: np.ndarray, keep: np.ndarray, eps: float = 1e-6) -> np.ndarray:
  """(v − mean) / (std + eps) over the kept [G,T] entries of each task; 0 where not kept or fewer than 2 kept.

  Args:
    values: float[P,G,T], read only where kept.
    keep: bool[P,G,T].

  Returns:
    float32[P,G,T].
  """
  n = keep.sum(axis=(1, 2), keepdims=True)
  mean = np.where(keep, values, 0.0).sum(axis=(1, 2), keepdims=True) / np.maximum(n, 1)
  centred = np.where(keep, values - mean, 0.0)
  std = np.sqrt((centred ** 2).sum(axis=(1, 2), keepdims=True) / np.maximum(n - 1, 1))
  return np.where(keep & (n >= 2), centred / (std + eps), 0.0).astype(np.float32)


# Methods and the registry -------------------------------------------------------------------------------------

class TableRow(NamedTuple):
  """A method's cells of the method table, except its name and its keep rule's `text`."""
  score: str
  gamma: str
  advantage: str
  spread: str  # how [P,G] becomes [P,G,T]


@dataclasses.dataclass(frozen=True)
class Method:
  """A training method: its keep rule, its credit estimator, its per-turn score if it has one, and its row."""
  name: str
  keep: KeepRule
  credit: CreditFn
  row: TableRow
  score: TurnScore | None = None

  @property
  def timed_score(self) -> bool:
    """Whether the per-turn score uses measured speedups (degenerates to correctness without timings)."""
    return self.score is not None and self.score.timed

  @property
  def uses_dcp(self) -> bool:
    """Whether the keep rule is DCP, so the DCP thresholds matter."""
    return self.keep.uses_dcp

  @property
  def table_row(self) -> tuple[str, ...]:
    """The cells of this method's row, in the order of `TABLE_HEADER`."""
    return (f"`{self.name}`", self.keep.text, *self.row)


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
  """Adds `method` to `METHODS` under its name; a name can be registered once."""
  if method.name in METHODS:
    raise ValueError(f"method {method.name!r} is already registered")
  METHODS[method.name] = method
  return method


def get_method(name: str) -> Method:
  if name not in METHODS:
    raise ValueError(f"unknown method {name!r}; choose one of {sorted(METHODS)}")
  return METHODS[name]


_LEAP_SCORE = "first-pass turn (level)"
register(Method("leap", DCP, RankCredit(gamma=1.0), TableRow(
    _LEAP_SCORE, "1.0", "rank reward over levels (`rank_reward`)",
    "`turn_advantages`: A>0 flows back to turns <= first pass with gamma^(k-t); A<=0 on every kept turn")))
register(Method("leap_no_dcp", UNTIL_SOLVED, RankCredit(gamma=1.0), TableRow(
    _LEAP_SCORE, "1.0", "rank reward", "`turn_advantages` as `leap`")))
register(Method("grpo", SINGLE_TURN, grpo_credit, TableRow(
    "1[correct]", "-", "`grpo_advantages` (group mean/std)", "turn 1 only")))
register(Method("grpo_mt", UNTIL_SOLVED, grpo_credit, TableRow(
    "1[correct at any kept turn]", "-", "`grpo_advantages`", "the same value on every kept turn")))
register(Method("kevin", ALL_TURNS, ReturnsCredit(KEVIN_SCORE, gamma=0.4, advantage=normalise_per_task), TableRow(
    "0.3*1[correct] + min(speedup, 10) (speedup only where timed and correct; without timings it is "
    "0.3*1[correct])", "0.4", "`kevin_returns`, normalised over all kept turn samples of the task",
    "per turn (returns are per turn)"), score=KEVIN_SCORE))
register(Method("trloo", UNTIL_SOLVED, ReturnsCredit(TRLOO_SCORE, gamma=1.0, advantage=rewards.trloo_advantages),
                TableRow("0.5*1[correct] + 0.5*min(speedup, 3) where timed and correct (Dr. Kernel; its profiling "
                         "terms are left out)", "1.0", "`trloo_advantages` on `kevin_returns(gamma=1)`",
                         "per turn (leave-one-out baseline per turn index)"), score=TRLOO_SCORE))


# Module-level entry points (the rollout harness and the training loop call these) ----------------------------

def max_turns(method: Method, num_turns: int) -> int:
  """Turns a rollout of `method` may use: 1 for single-turn GRPO, else the configured T."""
  return method.keep.max_turns(num_turns)


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
  """bool[P]: groups allowed past turn 1 (the DCP gate for `leap`, all groups otherwise, none for `grpo`)."""
  return method.keep.group_active(first_turn_success, valid, t_min, t_max)


def next_turn(method: Method, solved_so_far: np.ndarray, active: np.ndarray, valid: np.ndarray) -> np.ndarray:
  """bool[P,G]: samples that get the next turn.

  Args:
    solved_so_far: bool[P,G], passed at some turn so far.
    active: bool[P], from `group_active`.
    valid: bool[P,G], no infrastructure error so far.
  """
  return method.keep.next_turn(solved_so_far, active, valid)


def turn_scores(method: Method, success: np.ndarray, speedup: np.ndarray) -> np.ndarray:
  """float32[P,G,T] per-turn score of a method that has one (`kevin`, `trloo`).

  Args:
    success: bool[P,G,T].
    speedup: float32[P,G,T], NaN where not timed (a speedup flagged as suspicious arrives as NaN).
  """
  if method.score is None:
    raise ValueError(f"method {method.name!r} has no per-turn score")
  return method.score(success, speedup)


def credit(method: Method, success: np.ndarray, keep: np.ndarray, valid: np.ndarray,
           speedup: np.ndarray) -> Credit:
  """Advantages of one rollout under `method`.

    s'    = s ∧ keep,   keep' = keep ∧ valid
    Credit = method.credit(s', keep', valid, speedup)

  Args:
    success: bool[P,G,T], read only where kept.
    keep: bool[P,G,T], turns that were generated and evaluated (false for invalid samples).
    valid: bool[P,G].
    speedup: float32[P,G,T], NaN where not timed.
  """
  success = np.asarray(success, bool) & keep
  keep = np.asarray(keep, bool) & valid[..., None]
  return method.credit(success, keep, valid, np.asarray(speedup, np.float32))


def table_markdown() -> str:
  """The method table (for the README): one row per registered method, in registration order."""
  rows = [TABLE_HEADER, *(m.table_row for m in METHODS.values())]
  lines = ["| " + " | ".join(row) + " |" for row in rows]
  return "\n".join([lines[0], "|" + "---|" * len(TABLE_HEADER), *lines[1:]])
