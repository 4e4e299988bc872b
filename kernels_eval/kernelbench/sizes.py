"""Check sizes of a KernelBench problem: its module-level integer constants, shrunk for a CPU.

Rule (`check_sizes`): a constant <= KEEP (16) is kept (kernel sizes, strides, channel counts, dims of a
reduction); the k-th constant above KEEP, in file order (k = 0, 1, ...), becomes min(c, 17 + 2k). Every
shrunk size is odd, so a problem with any constant above 16 has a non-power-of-two size, and different
constants get different sizes (a transposed weight or swapped axes cannot pass on square shapes); a
constant used twice (a square matrix) stays one size. Element counts then stay around 17^rank.

The rule does not fit where sizes are tied (heads dividing an embedding, groups dividing channels): those
problems get `OVERRIDES[(level, file name)]`, constants set by hand on top of the rule; the caller may add
its own table (`overrides=`). At full size (a GPU) the constants are the file's own.
"""
from __future__ import annotations

from typing import Mapping

KEEP = 16
FIRST = 17
# (level, problem file name without .py) -> {constant: check size}
OVERRIDES: dict[tuple[int, str], dict[str, int]] = {}


def check_sizes(constants: Mapping[str, int], level: int = 0, name: str = "",
                overrides: Mapping[tuple[int, str], Mapping[str, int]] | None = None) -> dict[str, int]:
  """The check size of every constant (see the module docstring), overrides applied last."""
  out, k = {}, 0
  for key, value in constants.items():
    if value <= KEEP:
      out[key] = value
    else:
      out[key] = min(value, FIRST + 2 * k)
      k += 1
  for table in (OVERRIDES, overrides or {}):
    out.update(table.get((level, name), {}))
  return out
