"""A tiny training run for the checkpoint tests: resumes from its workdir, stops cleanly on SIGTERM.

  python tests/checkpoint_resume_script.py --workdir W --steps 4 --every 2 [--sigkill_after 3] [--sigterm_after 3]

Synthetic batches depend only on the step, so a run that resumes must end with the same parameters as a
run that never stopped. Prints one JSON line {"step", "resumed_from", "stopped_by_signal", "sampler"}
and writes the final parameters to `<workdir>/final_params.npz`.
"""
import argparse
import functools
import json
import os
import signal
import sys

if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from configs import common  # noqa: E402
from leap_jax.models import ModelConfig, Transformer  # noqa: E402
from leap_jax.train import learner as learner_lib  # noqa: E402
from leap_jax.train import optim, run_record  # noqa: E402
from leap_jax.train.batch import batch_from_numpy  # noqa: E402
from leap_jax.train.checkpoint import Checkpointer  # noqa: E402
from leap_jax.train.config import from_mapping  # noqa: E402
from leap_jax.train.preemption import StopRequest  # noqa: E402

TINY = dict(model_type="llama", vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
B, L = 8, 12


def config() -> dict:
  c = {"optim": common.optim(), "learner": common.learner(), "checkpoint": common.checkpoint()}
  c["optim"].learning_rate = 1e-3
  c["learner"].mu = 2
  c["learner"].num_minibatches = 2
  return {k: v.to_dict() for k, v in c.items()}


@functools.lru_cache(maxsize=None)
def setup():
  """(learner, initial params); cached so repeated runs in one process reuse the compiled step."""
  graphdef, params = nnx.split(Transformer(ModelConfig.from_hf_config(TINY), rngs=nnx.Rngs(0)))
  c = config()
  optim_cfg = from_mapping(optim.OptimConfig, c["optim"])
  learner_cfg = from_mapping(learner_lib.LearnerConfig, c["learner"], grad_accum_steps=optim_cfg.grad_accum_steps)
  learner = learner_lib.Learner(learner_lib.model_logprob_fn(graphdef, chunk_size=None),
                                optim.make_optimizer(optim_cfg), learner_cfg)
  return learner, params


def synthetic_batch(step: int):
  rng = np.random.default_rng(1000 + step)
  policy_mask = np.zeros((B, L), bool)
  policy_mask[:, 4:] = True
  return batch_from_numpy(
      tokens=rng.integers(0, TINY["vocab_size"], (B, L)), policy_mask=policy_mask,
      advantages=np.repeat(rng.normal(size=(B, 1)), L, axis=1),
      old_logprobs=-np.log(TINY["vocab_size"]) + 0.1 * rng.normal(size=(B, L)))


def run(workdir: str, steps: int, every: int, sigkill_after: int = 0, sigterm_after: int = 0) -> dict:
  learner, params = setup()
  ckpt = Checkpointer(workdir, every=every, keep=2)
  restored = ckpt.restore_latest(learner.abstract_state(params))
  if restored is None:
    state, sampler, resumed_from = learner.init_state(params, seed=0), {"tasks_drawn": 0}, None
    run_record.write_run_record(workdir, config(), {"learner": 0, "model_init": 0})
  else:
    state, sampler, resumed_from = restored["state"], restored["sampler"], restored["step"]
  stopped = False
  with StopRequest() as stop:
    while int(state.step) < steps:
      step = int(state.step)
      state, _ = learner.step(state, synthetic_batch(step))
      sampler = {"tasks_drawn": sampler["tasks_drawn"] + B}
      step += 1
      if step == sigterm_after:
        os.kill(os.getpid(), signal.SIGTERM)
      if stop.requested_anywhere():
        ckpt.save(step, state, sampler, config(), force=True)
        stopped = True
        break
      ckpt.save(step, state, sampler, config(), force=step == steps)
      if step == sigkill_after:
        ckpt.wait()
        os.kill(os.getpid(), signal.SIGKILL)
  ckpt.close()
  flat = {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(state.params)}
  np.savez(os.path.join(workdir, "final_params.npz"), **flat)
  return {"step": int(state.step), "resumed_from": resumed_from, "stopped_by_signal": stopped, "sampler": sampler,
          "rng": np.asarray(state.rng).tolist()}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--steps", type=int, required=True)
  parser.add_argument("--every", type=int, required=True)
  parser.add_argument("--sigkill_after", type=int, default=0, help="SIGKILL this process after that step")
  parser.add_argument("--sigterm_after", type=int, default=0, help="SIGTERM this process after that step")
  args = parser.parse_args()
  print(json.dumps(run(args.workdir, args.steps, args.every, args.sigkill_after, args.sigterm_after)), flush=True)


if __name__ == "__main__":
  main()
