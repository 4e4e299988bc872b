"""Timing of a jitted computation, the one method used for references and Pallas candidates alike.

`median_ms(fn, sets)`: `WARMUP` calls, then `REPS` timed calls rotating over the input sets; before each,
the call's inputs are fresh device copies of its set, the L2 cache is flushed (a jitted write over a buffer
twice the size of an H100/H200's L2) and the device is synchronised; each call is timed from dispatch to
`block_until_ready` of its output, and every output is kept until the end. So no call can find what an
earlier one left behind: not marks written into its inputs, not an earlier output in a reused buffer.
Worker-side only (imports JAX). The CUDA path times with CUDA events inside its harness program
(`cuda/runner.cu`).
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

WARMUP, REPS = 3, 20
L2_FLUSH_BYTES = 2 * 50 << 20


def median_ms(fn: Callable[..., Any], sets: Sequence[Sequence[jax.Array]], reps: int = REPS,
              warmup: int = WARMUP) -> float:
  """Median wall time in milliseconds of `fn(*sets[i % len(sets)])`, each call after an L2 flush."""
  flush_bytes = L2_FLUSH_BYTES if jax.default_backend() == "gpu" else 1 << 20
  scratch = jnp.zeros((flush_bytes // 4,), jnp.float32)
  bump = jax.jit(lambda x: x + 1.0)
  for i in range(warmup):
    jax.block_until_ready(fn(*sets[i % len(sets)]))
  samples, kept = [], []
  for i in range(reps):
    args = jax.block_until_ready([jnp.array(x, copy=True) for x in sets[i % len(sets)]])
    scratch = jax.block_until_ready(bump(scratch))
    start = time.perf_counter()
    kept.append(jax.block_until_ready(fn(*args)))
    samples.append((time.perf_counter() - start) * 1e3)
  del kept
  return statistics.median(samples)
