"""The size ladders that sampler and learner shapes are drawn from, so that a run compiles few distinct calls."""


def bucket(n: int, floor: int = 1, per_octave: int = 2) -> int:
  """The smallest size >= n on the ladder floor * q, q = 1, 2, ..., then `per_octave` evenly spaced steps per
  doubling: per_octave = 2 gives floor, 2 floor, 3 floor, 4 floor, 6 floor, 8 floor, 12 floor, ...; 4 gives
  ..., 4 floor, 5 floor, 6 floor, 7 floor, 8 floor, 10 floor, 12 floor, ...

  A run compiles O(per_octave log n) distinct shapes; above per_octave * floor the rounding adds less than
  1 / (per_octave + 1) of the rounded size (a third for 2), against up to a half for powers of two.
  """
  if floor < 1 or per_octave < 1:
    raise ValueError(f"bucket floor and per_octave must be >= 1, got {floor} and {per_octave}")
  q = 1
  while floor * q < n:
    q += max(1, (1 << (q.bit_length() - 1)) // per_octave)
  return floor * q


def bucket_length(n: int, minimum: int = 16) -> int:
  """The sampler's sizes (prompt tokens, cache slots, rows): `bucket` from `minimum` with four steps per
  octave, so a call pads by less than a fifth (a 775-token prompt -> 896; with powers of two, 1024). Each size
  costs a compile of about a second on CPU, against seconds of prefill saved per call."""
  return bucket(int(n), minimum, per_octave=4)
