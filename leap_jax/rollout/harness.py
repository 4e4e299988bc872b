"""Multi-turn rollouts: P tasks x G episodes x up to T turns, with per-method turn pruning.

One step of `Rollout.run`:
  turn 1: every episode gets [system, task]; all P*G rows are sampled in one batched call
          (each prompt is prefilled once); code is extracted from each reply and evaluated
          (the evaluator runs the requests in parallel on single-threaded worker processes).
  turn t+1: only episodes the method's keep rule grants (`methods.next_turn`, DCP for `leap`)
          get a user message built from the evaluator's feedback; all of them are sampled in
          one batched call. Pruned turns are never generated or evaluated. With more than 2
          cores (`overlap`), a later turn is sampled in two batched calls and the first half is
          evaluated while the second is generated; on 2 cores generation gets both.
Context policies: "episode" continues each row's KV cache with the feedback turn; "latest"
starts a fresh prompt with the statement, the latest code and its feedback.
An episode whose context overflows is `truncated`: it stops, and counts as a failure or makes
the trajectory invalid (config `truncated_as`). Evaluator infrastructure errors are retried
`eval_retries` times; after that the whole trajectory is invalid.
Sampler keys are `row_keys(seed, step, episode, turn)`; evaluator request ids are
"s<seed>-k<step>-e<episode>-t<turn>" (with "-r<attempt>" on retries), episode = p * G + g.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from typing import Any, Protocol, Sequence

import numpy as np

import kernels_eval
from kernels_eval import schema
from leap_jax.rollout import methods as methods_lib
from leap_jax.rollout import prompts
from leap_jax.sampling import sampler as sampler_lib
from leap_jax.sampling.episode import Episode

TRUNCATED_AS = ("failure", "invalid")
STATUS_NAMES = schema.STATUSES + ("truncated",)
TRUNCATED = len(schema.STATUSES)  # status code of a truncated turn
NOT_GENERATED = -1


class SamplerLike(Protocol):
  """What the harness samples from: `leap_jax.sampling.Sampler` or a test double with its interface."""

  def start(self, weights, prompts: Sequence[Sequence[int]], num_samples: int, key, *, max_new_tokens: int,
            sampling: sampler_lib.SamplingParams) -> tuple[Any, list[sampler_lib.Completion]]:
    ...

  def continue_(self, weights, state, rows: Sequence[int], new_turn_tokens: Sequence[Sequence[int]], key, *,
                max_new_tokens: int, sampling: sampler_lib.SamplingParams
                ) -> tuple[Any, list[sampler_lib.Completion]]:
    ...


class Evaluator(Protocol):
  """`kernels_eval.Evaluator` or anything with its `evaluate_many`."""

  def evaluate_many(self, requests: Sequence[Any]) -> list[schema.EvalResult]:
    ...


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
  """Shapes and policies of a rollout (config section `rollout`, see configs/default.py)."""
  num_problems: int
  group_size: int
  num_turns: int
  max_new_tokens: int
  context: str = "episode"
  truncated_as: str = "failure"
  eval_retries: int = 2
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  overlap: str = "auto"

  def __post_init__(self):
    for name in ("num_problems", "group_size", "num_turns", "max_new_tokens"):
      if getattr(self, name) < 1:
        raise ValueError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")
    if self.context not in prompts.CONTEXT_POLICIES:
      raise ValueError(f"rollout.context {self.context!r} is not one of {prompts.CONTEXT_POLICIES}")
    if self.truncated_as not in TRUNCATED_AS:
      raise ValueError(f"rollout.truncated_as {self.truncated_as!r} is not one of {TRUNCATED_AS}")
    if self.eval_retries < 0:
      raise ValueError(f"rollout.eval_retries must be >= 0, got {self.eval_retries}")
    if self.overlap not in ("auto", "on", "off"):
      raise ValueError(f"rollout.overlap {self.overlap!r} is not one of ('auto', 'on', 'off')")

  @property
  def sampling(self) -> sampler_lib.SamplingParams:
    return sampler_lib.SamplingParams(self.temperature, self.top_p, self.top_k)

  @property
  def overlap_enabled(self) -> bool:
    """Evaluation overlaps generation only with more than 2 cores (generation needs them otherwise)."""
    return self.overlap == "on" or (self.overlap == "auto" and (os.cpu_count() or 1) > 2)


@dataclasses.dataclass
class RolloutBatch:
  """Everything one rollout step produced.

  Shapes: P tasks, G episodes per task, T turns.
    task_ids: [P].
    segments: [P*G] lists of token records; "episode" context: one growing Episode per
      episode; "latest": one Episode per turn. A record counts its turns from 0.
    first_turns: [P*G] lists, the rollout turn each record of `segments` begins at (all 0 under "episode").
    codes, results: dicts (p, g, t) -> extracted code (or None) / final EvalResult of the turn.
    generated: bool[P,G,T] the turn was sampled.
    success: bool[P,G,T] status `correct`.
    status: int32[P,G,T] code into STATUS_NAMES, NOT_GENERATED (-1) where no turn.
    speedup: float32[P,G,T], NaN where not timed or where the evaluator flagged it `suspicious_speedup`.
    truncated: bool[P,G,T].
    valid: bool[P,G] no infrastructure error after retries and (with truncated_as="invalid") no truncation.
    active: bool[P] groups allowed past turn 1 by the keep rule.
    tokens: int32[P,G,T] tokens the policy generated in each turn.
    counters: generated_rows, generated_tokens, evaluator_calls, eval_retries, turn_calls.
    timings: seconds in "generate" and "evaluate".
  """
  task_ids: list[str]
  segments: list[list[Episode]]
  first_turns: list[list[int]]
  codes: dict[tuple[int, int, int], str | None]
  results: dict[tuple[int, int, int], schema.EvalResult]
  generated: np.ndarray
  success: np.ndarray
  status: np.ndarray
  speedup: np.ndarray
  truncated: np.ndarray
  valid: np.ndarray
  active: np.ndarray
  tokens: np.ndarray
  counters: dict[str, int]
  timings: dict[str, float]

  @property
  def keep(self) -> np.ndarray:
    """bool[P,G,T] turns that exist and train: generated turns of valid trajectories."""
    return self.generated & self.valid[..., None]


def request_id(seed: int, step: int, episode: int, turn: int) -> str:
  return f"s{seed}-k{step}-e{episode}-t{turn}"


def retry_id(rid: str, attempt: int) -> str:
  """The request id of retry `attempt` (0: the first try) of request `rid`."""
  return rid if attempt == 0 else f"{rid}-r{attempt}"


class Rollout:
  """Runs rollout steps for one method.

  Args:
    sampler: a Sampler (or test double) whose completions end in the chat format's stop ids.
    chat: a `leap_jax.sampling.chat.ChatFormat`.
    evaluator: has `evaluate_many(requests: list[kernels_eval.EvalRequest]) -> list[EvalResult]`.
    method: a `methods.Method`.
    settings: RolloutSettings.
    lang: "pallas" or "cuda".
    seed: run seed.
    dcp: (t_min, t_max) for the `dcp` keep rule.
  """

  def __init__(self, sampler: SamplerLike, chat, evaluator: Evaluator, *, method: methods_lib.Method,
               settings: RolloutSettings, lang: str, seed: int, dcp: tuple[int, int]):
    self.sampler = sampler
    self.chat = chat
    self.evaluator = evaluator
    self.method = method
    self.settings = settings
    self.lang = lang
    self.seed = seed
    self.dcp = dcp
    self.num_turns = methods_lib.max_turns(method, settings.num_turns)

  def run(self, weights, tasks: Sequence[Any], step: int) -> RolloutBatch:
    """One rollout step over `tasks` (P of them) with the policy `weights`."""
    s = self.settings
    P, G, T = len(tasks), s.group_size, self.num_turns
    system = prompts.system_message(self.lang)
    texts = [kernels_eval.render_task(task, self.lang) for task in tasks]
    shape = (P, G, T)
    out = RolloutBatch(
        task_ids=[getattr(t, "id", str(i)) for i, t in enumerate(tasks)],
        segments=[[Episode()] for _ in range(P * G)], first_turns=[[0] for _ in range(P * G)], codes={}, results={},
        generated=np.zeros(shape, bool), success=np.zeros(shape, bool),
        status=np.full(shape, NOT_GENERATED, np.int32), speedup=np.full(shape, np.nan, np.float32),
        truncated=np.zeros(shape, bool), valid=np.ones((P, G), bool), active=np.zeros(P, bool),
        tokens=np.zeros(shape, np.int32),
        counters=dict(generated_rows=0, generated_tokens=0, evaluator_calls=0, eval_retries=0, turn_calls=0),
        timings=dict(generate=0.0, evaluate=0.0))
    solved = np.zeros((P, G), bool)
    state = None
    for t in range(T):
      if t == 0:
        live = np.ones((P, G), bool)
      else:
        live = methods_lib.next_turn(self.method, solved, out.active, out.valid) & ~out.truncated[:, :, :t].any(-1)
      rows = np.flatnonzero(live.reshape(-1))
      if not len(rows):
        break
      if t == 0:
        started = time.perf_counter()
        first = [self.chat.first_turn(text, system) for text in texts]
        state, completions = self.sampler.start(weights, first, G, sampler_lib.row_keys(self.seed, step, rows, t),
                                               max_new_tokens=s.max_new_tokens, sampling=s.sampling)
        out.timings["generate"] += time.perf_counter() - started
        out.counters["turn_calls"] += 1
        pending = self._record(out, tasks, rows, t, [first[r // G] for r in rows], completions, step)
        started = time.perf_counter()
        self._evaluate(out, pending)
        out.timings["evaluate"] += time.perf_counter() - started
      else:
        state = self._later_turn(out, weights, state, tasks, texts, rows, t, step)
      solved |= out.success[:, :, t]
      if t == 0:
        out.active = methods_lib.group_active(self.method, out.success[:, :, 0], out.valid, *self.dcp)
    return out

  def _later_turn(self, out: RolloutBatch, weights, state, tasks, texts, rows, t, step):
    """Samples and evaluates turn t > 0 of `rows`; returns the sampler state.

    With overlap enabled (more than 2 cores) the rows are sampled in two batched calls and the first
    half is evaluated in a background thread while the second half is generated.
    """
    s = self.settings
    system = prompts.system_message(self.lang)
    chunks = np.array_split(rows, 2) if s.overlap_enabled and len(rows) > 1 else [rows]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as background:
      evaluations = []
      for chunk in chunks:
        keys = sampler_lib.row_keys(self.seed, step, chunk, t)
        started = time.perf_counter()
        if s.context == "episode":
          new_turns = [self.chat.feedback_turn(self._feedback(out, r, t - 1),
                                               out.segments[r][-1].completion(t - 1)) for r in chunk]
          state, completions = self.sampler.continue_(weights, state, chunk, new_turns, keys,
                                                     max_new_tokens=s.max_new_tokens, sampling=s.sampling)
        else:
          new_turns = [self.chat.first_turn(self._latest_user(out, texts, r, t - 1), system) for r in chunk]
          _, completions = self.sampler.start(weights, new_turns, 1, keys, max_new_tokens=s.max_new_tokens,
                                             sampling=s.sampling)
        out.timings["generate"] += time.perf_counter() - started
        out.counters["turn_calls"] += 1
        pending = self._record(out, tasks, chunk, t, new_turns, completions, step)
        evaluations.append(background.submit(self._evaluate, out, pending))
      started = time.perf_counter()
      for evaluation in evaluations:
        evaluation.result()
      out.timings["evaluate"] += time.perf_counter() - started
    return state

  def _record(self, out: RolloutBatch, tasks, rows, t, new_turns, completions, step) -> list[tuple]:
    """Appends the turn to each row's token record; returns the (p, g, request) to evaluate."""
    s = self.settings
    G = s.group_size
    pending = []
    for r, turn_ids, c in zip(rows, new_turns, completions):
      p, g = divmod(int(r), G)
      n = len(c.tokens)
      out.counters["generated_rows"] += int(n > 0)
      out.counters["generated_tokens"] += n
      out.tokens[p, g, t] = n
      truncated = c.finish_reason == "truncated"
      if n:
        if s.context == "latest" and t > 0:
          out.segments[r].append(Episode())
          out.first_turns[r].append(t)
        segment = out.segments[r][-1]
        segment.add_prompt(turn_ids)
        segment.add_completion(c.tokens, c.logprobs, c.finish_reason)
      out.generated[p, g, t] = n > 0
      if truncated:
        out.truncated[p, g, t] = True
        out.status[p, g, t] = TRUNCATED
        if s.truncated_as == "invalid":
          out.valid[p, g] = False
        continue
      rid = request_id(self.seed, step, int(r), t)
      try:
        code = kernels_eval.extract_code(self.chat.decode(c.tokens, skip_special_tokens=True), self.lang,
                                         tasks[p])
      except kernels_eval.NoCodeBlock as e:
        out.codes[(p, g, t)] = None
        self._store(out, p, g, t, kernels_eval.missing_code_result(tasks[p], self.lang, str(e), rid))
        continue
      out.codes[(p, g, t)] = code
      pending.append((p, g, t, tasks[p], code, rid))
    return pending

  def _evaluate(self, out: RolloutBatch, pending: list[tuple]) -> None:
    """Evaluates the turn's code (the evaluator runs requests in parallel), retrying infrastructure errors."""
    attempt = 0
    while pending:
      requests = [kernels_eval.EvalRequest(task=task, source=code, lang=self.lang,
                                           request_id=retry_id(rid, attempt))
                  for _, _, _, task, code, rid in pending]
      results = self.evaluator.evaluate_many(requests)
      if len(results) != len(requests):
        raise RuntimeError(f"evaluator returned {len(results)} results for {len(requests)} requests")
      out.counters["evaluator_calls"] += len(requests)
      if attempt:
        out.counters["eval_retries"] += len(requests)
      retry = []
      for item, result in zip(pending, results):
        p, g, t = item[:3]
        if result.valid or attempt >= self.settings.eval_retries:
          self._store(out, p, g, t, result)
          if not result.valid:
            out.valid[p, g] = False
        else:
          retry.append(item)
      pending, attempt = retry, attempt + 1

  @staticmethod
  def _store(out: RolloutBatch, p: int, g: int, t: int, result: schema.EvalResult) -> None:
    out.results[(p, g, t)] = result
    out.success[p, g, t] = result.success
    out.status[p, g, t] = schema.STATUS_CODE[result.status]
    if result.timing is not None and "suspicious_speedup" not in result.flags:
      out.speedup[p, g, t] = result.timing.speedup

  def _feedback(self, out: RolloutBatch, r: int, t: int) -> str:
    p, g = divmod(int(r), self.settings.group_size)
    result = out.results[(p, g, t)]
    return prompts.feedback_turn(self.lang, result.status, result.feedback)["content"]

  def _latest_user(self, out: RolloutBatch, texts: list[str], r: int, t: int) -> str:
    p, g = divmod(int(r), self.settings.group_size)
    result = out.results[(p, g, t)]
    messages = prompts.latest_context(self.lang, texts[p], out.codes.get((p, g, t)) or "", result.status,
                                      result.feedback)
    return messages[1]["content"]
