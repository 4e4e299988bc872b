"""Does RL move the policy where the reward points? The embedded model after a short SFT, on the level-0 train
tasks whose turn-1 pass rate is mixed, at a learning rate high enough to move it in a few steps (about 20
minutes on 2 cores). Also the scale of `launch/compare_methods.py`'s method comparison.

How the pool was picked (docs/results.md, "Learning check"): `launch/sft.py` with 5 SFT steps instead of 6, then
8 turn-1 samples per level-0 train task at the rollout temperature; the tasks whose rate is in [0.2, 0.8] form
the pool (add 0.625, square 0.625, relu 0.75, row_sum 0.75: 0.6875 on the pool). The pool's turn-1 pass rate is
measured before and after RL with the same sampling keys (8 samples per task); held-out Acc@1..Acc@3 on the
level-0 eval tasks every few steps, 4 trajectories per task at the rollout temperature (the policy solves all
three greedily from the start).

  python launch/train.py --config configs/learn_check.py
  python launch/compare_methods.py --config configs/learn_check.py
"""
import ml_collections

from configs import default

POOL = ("add", "relu", "row_sum", "square")


def get_config() -> ml_collections.ConfigDict:
  c = default.get_config()
  c.workdir = "workdirs/learn_check"
  c.steps = 10
  c.tasks.levels = (0,)
  c.tasks.ids = POOL
  c.rollout.num_problems = 2
  c.rollout.group_size = 8
  c.sft.steps = 5
  c.precheck.samples_per_task = 8
  c.heldout.levels = (0,)
  c.heldout.every = 5
  c.heldout.samples = 4
  c.heldout.temperature = c.rollout.temperature
  c.optim.learning_rate = 2e-5
  c.checkpoint.every = 5
  return c
