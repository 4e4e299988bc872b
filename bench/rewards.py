"""Times the jitted `leap_rewards` against the loop reference on P=1024, G=16, T=4.

Compile time is excluded (one warm-up call); each side reports the median of its repeats.
Run as `python bench/rewards.py [--repeats N]`.
"""
import argparse
import pathlib
import statistics
import sys
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "tests")]

import jax  # noqa: E402
import numpy as np  # noqa: E402

from leap_jax import rewards  # noqa: E402
import test_rewards_reference as ref  # noqa: E402


def _median_seconds(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--problems", type=int, default=1024)
  parser.add_argument("--group", type=int, default=16)
  parser.add_argument("--turns", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=5, help="loop-reference repeats (jit gets 20x)")
  args = parser.parse_args()
  p, g, t = args.problems, args.group, args.turns
  t_min, t_max, gamma = g // 2, g, 1.0

  rng = np.random.default_rng(0)
  success = rng.uniform(size=(p, g, t)) < rng.uniform(size=(p, 1, 1))
  valid = rng.uniform(size=(p, g)) > 0.05
  success_l, valid_l = success.tolist(), valid.tolist()

  jitted = jax.jit(rewards.leap_rewards)
  device_args = jax.device_put((success, t_min, t_max, gamma, valid))
  out = jax.block_until_ready(jitted(*device_args))
  expected = ref.leap_rewards(success_l, t_min, t_max, gamma, valid_l)
  np.testing.assert_allclose(np.asarray(out.advantages), np.array(expected["advantages"]), atol=1e-6)

  jit_s = _median_seconds(lambda: jax.block_until_ready(jitted(*device_args)), 20 * args.repeats)
  loop_s = _median_seconds(lambda: ref.leap_rewards(success_l, t_min, t_max, gamma, valid_l), args.repeats)
  print(f"leap_rewards P={p} G={g} T={t} on {jax.devices()[0].platform}")
  print(f"jit  : {jit_s * 1e3:9.3f} ms (median of {20 * args.repeats})")
  print(f"loop : {loop_s * 1e3:9.3f} ms (median of {args.repeats})")
  print(f"ratio loop/jit: {loop_s / jit_s:.1f}x")


if __name__ == "__main__":
  main()
