"""Checks on what the harness observed, beyond comparing outputs with the reference.

The comparison of each trial's output with the reference is the evaluator core's (`kernels_eval.compare`,
in the parent; the harness NaN-poisons the output before every call, so an output that the candidate
never wrote fails there). These checks use the harness's own observations:

  harness_findings  no kernel launched (`no_kernel_launched`), a launch on a stream other than the
                    harness's (`extra_stream`), an input buffer changed by the call (`input_mutation`);
  determinism       trial 0 run twice must agree within tolerance (`nondeterministic`); atomics may
                    reorder float sums, so bitwise equality is not required;
  roofline_flags    `faster_than_roofline` when the kernel beats the time needed to move its inputs and
                    output once at peak bandwidth (the core adds `suspicious_speedup` above 10x):
                      t_min = (input bytes + output bytes) / peak_bandwidth.
Each finding is (rejected_reason, feedback) or None.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from kernels_eval import compare as compare_lib

H200_PEAK_GBPS = 4800.0

Finding = tuple[str, str]


def harness_findings(launches: int, foreign_streams: int, mutated: Sequence[tuple[int, int]],
                     input_names: Sequence[str]) -> Finding | None:
  if launches == 0:
    return ("no_kernel_launched", "solution() launched no kernel: compute the output with a kernel launched "
            "on `stream`")
  if foreign_streams:
    return ("extra_stream", f"{foreign_streams} kernel launch(es) used a stream other than the `stream` "
            "argument: launch every kernel on `stream`")
  if mutated:
    names = sorted({input_names[k] if 0 <= k < len(input_names) else f"input {k}" for _, k in mutated})
    trials = sorted({t + 1 for t, _ in mutated})
    return ("input_mutation", f"solution() modified its input(s) {', '.join(names)} (trial(s) "
            f"{', '.join(map(str, trials))}): inputs are read-only")
  return None


def determinism(first: np.ndarray, again: np.ndarray, tolerance: dict[str, float]) -> Finding | None:
  c = compare_lib.compare(again, first, tolerance["atol"], tolerance["rtol"])
  if c.ok:
    return None
  return ("nondeterministic", f"the same inputs gave different outputs on a second call: {c.message}")


def roofline_ms(input_bytes: int, output_bytes: int, peak_gbps: float = H200_PEAK_GBPS) -> float:
  """Lower bound on any kernel's time: its inputs and output moved once at peak bandwidth (ms)."""
  return (input_bytes + output_bytes) / (peak_gbps * 1e9) * 1e3


def roofline_flags(kernel_ms: float, bound_ms: float) -> list[str]:
  return ["faster_than_roofline"] if kernel_ms < bound_ms else []
