"""One process of the two-process learner test: 4 CPU devices per process, one train step on a shared mesh.

  python tests/distributed_worker_script.py --process_id I --num_processes 2 --port P --out DIR

Process i feeds rows [i * B / n, (i + 1) * B / n) of the global batch; the parameters after the step
are gathered to every host and written to `DIR/params_<i>.npz`.
"""
import argparse
import os
import sys

if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  os.environ["JAX_PLATFORMS"] = "cpu"
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from leap_jax.models import ModelConfig, Transformer  # noqa: E402
from leap_jax.models import sharding as model_sharding  # noqa: E402
from leap_jax.train import learner as learner_lib  # noqa: E402
from leap_jax.train import optim  # noqa: E402
from leap_jax.train.batch import batch_from_numpy  # noqa: E402

TINY = dict(model_type="llama", vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
B, L = 8, 12


def global_batch():
  rng = np.random.default_rng(7)
  policy_mask = np.zeros((B, L), bool)
  policy_mask[:, 5:] = True
  return batch_from_numpy(
      tokens=rng.integers(0, TINY["vocab_size"], (B, L)), policy_mask=policy_mask,
      advantages=np.repeat(rng.normal(size=(B, 1)), L, axis=1),
      old_logprobs=-np.log(TINY["vocab_size"]) + 0.1 * rng.normal(size=(B, L)))


def train_one_step() -> dict[str, np.ndarray]:
  """One step on a ("data"=2, "fsdp"=2, "tensor"=2) mesh over all global devices; returns host params."""
  graphdef, params = nnx.split(Transformer(ModelConfig.from_hf_config(TINY), rngs=nnx.Rngs(0)))
  params = jax.tree.map(np.asarray, params)  # host values, identical in every process
  mesh = model_sharding.make_mesh(2, 2, 2)
  learner = learner_lib.Learner(learner_lib.model_logprob_fn(graphdef, chunk_size=None),
                                optim.make_optimizer(optim.OptimConfig(learning_rate=1e-3)),
                                learner_lib.LearnerConfig(num_minibatches=2), mesh=mesh)
  state = learner.init_state(params, seed=0, param_specs=model_sharding.partition_specs(params, mesh))
  rows = B // jax.process_count()
  lo = jax.process_index() * rows
  local = jax.tree.map(lambda x: x[lo:lo + rows], global_batch())
  state, metrics = learner.step(state, local)
  gathered = multihost_utils.process_allgather(state.params, tiled=True)
  flat = {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(gathered)}
  flat["metric/loss"] = np.asarray(metrics["loss"])
  return flat


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--process_id", type=int, required=True)
  parser.add_argument("--num_processes", type=int, required=True)
  parser.add_argument("--port", type=int, required=True)
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  jax.distributed.initialize(coordinator_address=f"localhost:{args.port}", num_processes=args.num_processes,
                             process_id=args.process_id)
  assert jax.local_device_count() == 4 and jax.device_count() == 4 * args.num_processes
  np.savez(os.path.join(args.out, f"params_{args.process_id}.npz"), **train_one_step())
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
