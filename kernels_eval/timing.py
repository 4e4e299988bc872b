"""Device time of a jitted computation: the one method used for references and Pallas candidates alike.

The CUDA harness (`cuda/runner.cu`) measures candidates the same way, with CUDA events around each loop.
For R rounds after `warmup` untimed calls:

  ms_r = (T[ N x (prep(i); fn(set i)) ] - T[ N x prep(i) ]) / N,        reported: median_r ms_r,

where prep(i) makes fresh device copies of the inputs of set i (sets rotate, the last call of a round is on
set 0) and flushes the L2 cache (a jitted read-modify-write of a buffer twice the size of an H200's L2).
T[loop] is the device time of the loop: each loop is enqueued behind a *head start*, one device computation
long enough for the host to enqueue the whole loop while it runs, and timed from before the head start to
the device's synchronisation. The head start and the preps appear in both terms and cancel, so the host's
dispatch cost never counts and neither do the copies or the flush. Every output of a measurement is kept
until it ends (up to `KEEP_BYTES`, which bounds N), so no call can find an earlier call's output in its
buffer, and fresh inputs mean no call finds marks an earlier one wrote into its inputs.

Worker-side only (imports JAX).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

WARMUP, ROUNDS, CALLS = 3, 5, 8
L2_FLUSH_BYTES = 2 * (64 << 20)
KEEP_BYTES = 4 << 30
HEAD_START_PASSES_PER_CALL = 4
RESOLUTION_MS = 1e-4  # a difference at or below this (noise around a near-empty call) is reported as this


@dataclasses.dataclass(frozen=True)
class Timing:
  """ms: median over rounds of the per-call device time; samples: one value per round; output: the
  output of the last timed call, which ran on the first set."""
  ms: float
  samples: tuple[float, ...]
  output: jax.Array


def _flush_fns(n_calls: int):
  flush_bytes = L2_FLUSH_BYTES if jax.default_backend() == "gpu" else 1 << 20
  scratch = jnp.zeros((flush_bytes // 4,), jnp.float32)
  flush = jax.jit(lambda x: x + 1.0)
  passes = HEAD_START_PASSES_PER_CALL * n_calls
  head_start = jax.jit(lambda x: lax.fori_loop(0, passes, lambda _, y: y * 0.5 + 1.0, x))
  return scratch, flush, head_start


def calls_per_round(out_bytes: int, rounds: int = ROUNDS, calls: int = CALLS) -> int:
  """N: `calls`, lowered so that the kept outputs of all rounds stay under `KEEP_BYTES` (at least 2)."""
  return max(2, min(calls, KEEP_BYTES // max(1, rounds * out_bytes)))


def measure(fn: Callable[..., Any], sets: Sequence[Sequence[jax.Array]], *, rounds: int = ROUNDS,
            calls: int = CALLS, warmup: int = WARMUP) -> Timing:
  """Per-call device time of `fn(*sets[i])` in milliseconds (see the module docstring)."""
  def fresh(s: int) -> list[jax.Array]:
    return [jnp.array(x, copy=True) for x in sets[s]]

  first = jax.block_until_ready(fn(*fresh(0)))
  n = calls_per_round(math.prod(first.shape) * first.dtype.itemsize, rounds, calls)
  for i in range(warmup):
    jax.block_until_ready(fn(*fresh(i % len(sets))))
  scratch, flush, head_start = _flush_fns(n)
  jax.block_until_ready(head_start(scratch))
  order = [(n - 1 - j) % len(sets) for j in range(n)]  # ends on set 0
  kept, samples = [first], []

  def loop(with_call: bool) -> float:
    nonlocal scratch
    jax.block_until_ready(scratch)
    start = time.perf_counter()
    scratch = head_start(scratch)
    for s in order:
      args = fresh(s)
      scratch = flush(scratch)
      if with_call:
        kept.append(fn(*args))
    jax.block_until_ready((scratch, kept[-1]))
    return time.perf_counter() - start

  for _ in range(rounds):
    prep_s = loop(with_call=False)
    call_s = loop(with_call=True)
    samples.append(max((call_s - prep_s) * 1e3 / n, RESOLUTION_MS))
  return Timing(ms=statistics.median(samples), samples=tuple(samples), output=kept[-1])
