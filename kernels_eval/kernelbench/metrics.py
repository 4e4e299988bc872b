"""KernelBench's metrics over one trajectory per problem: per level Acc@1..Acc@T and fast_p.

Acc@t (level L) = mean over L's problems of 1[solved at some turn <= t] (the LEAP protocol: every unsolved
trajectory gets all T turns, no pruning). fast_p (level L) = mean over L's problems of
1[solved and speedup > p], with the speedup of the first passing turn; only problems whose passing answer
was timed count (`timed` says how many), so fast_p is None on a machine that times nothing. fast_0 is the
share of timed problems solved.
"""
from __future__ import annotations

from typing import Mapping, Sequence

FAST_P = (0.0, 1.0, 1.5, 2.0)


def per_level(levels: Mapping[str, int], solved_by_turn: Mapping[str, int | None], num_turns: int,
              speedups: Mapping[str, float | None], ps: Sequence[float] = FAST_P) -> dict[int, dict]:
  """{level: {"problems", "Acc@t"..., "timed", "fast_p"...}} (see the module docstring)."""
  out = {}
  for level in sorted(set(levels.values())):
    ids = [i for i, lv in levels.items() if lv == level]
    row: dict = {"problems": len(ids)}
    for t in range(1, num_turns + 1):
      row[f"Acc@{t}"] = sum(solved_by_turn.get(i) is not None and solved_by_turn[i] <= t for i in ids) / len(ids)
    timed = [i for i in ids if speedups.get(i) is not None]
    row["timed"] = len(timed)
    for p in ps:
      row[f"fast_{p:g}"] = (sum(speedups[i] > p for i in timed) / len(timed)) if timed else None
    out[level] = row
  return out
