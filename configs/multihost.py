"""Several hosts: `jax.distributed.initialize`, then the h200 job sharded over every process's devices.

Run the same command on each host, with its own process id:
  python launch/train.py --config configs/multihost.py --config.model.base=/path/to/checkpoint \
    --config.distributed.coordinator_address=host0:1234 --config.distributed.num_processes=2 \
    --config.distributed.process_id=<i>
"""
import ml_collections

from configs import h200


def get_config() -> ml_collections.ConfigDict:
  c = h200.get_config()
  c.workdir = "workdirs/multihost"
  c.distributed.enabled = True
  c.distributed.coordinator_address = "localhost:1234"
  c.distributed.num_processes = 2
  c.distributed.process_id = 0
  c.mesh.data = -1  # one data-parallel replica group per process ...
  c.mesh.fsdp = 1  # ... override with --config.mesh.fsdp=<devices per host> to shard parameters instead
  c.rollout.num_problems = 16
  return c
