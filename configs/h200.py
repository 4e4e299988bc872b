"""One H200: a local HF checkpoint (default architecture Qwen2.5-1.5B-Instruct), Pallas-Triton tasks
(CUDA tasks with --config.tasks.lang=cuda), LEAP with P=8, G=8, T=3.

  python launch/train.py --config configs/h200.py --config.model.base=/path/to/Qwen2.5-1.5B-Instruct
"""
import ml_collections

from configs import default
from leap_jax.models.architectures import QWEN25_1P5B

def get_config() -> ml_collections.ConfigDict:
  c = default.get_config()
  c.workdir = "workdirs/h200"
  c.steps = 200
  c.model.base = ""  # set to a local HF checkpoint folder (config.json, safetensors, tokenizer)
  c.model.arch = dict(QWEN25_1P5B)
  c.model.tokenizer = ""
  c.model.dtype = "bfloat16"
  c.model.param_dtype = "float32"
  c.model.remat = "full"
  c.tasks.levels = (0, 1, 2)
  c.rollout.num_problems = 8
  c.rollout.group_size = 8
  c.rollout.num_turns = 3
  c.dcp.t_max = -1  # G (LEAP's reading)
  c.rollout.max_new_tokens = 1024
  c.rollout.max_context_len = 6144
  c.rollout.temperature = 1.0
  c.evaluator.workers = 8
  c.sft.enabled = False  # a 1.5B instruct model starts in the mixed regime on level 0-2 (check the precheck)
  c.precheck.samples_per_task = 4
  c.heldout.levels = (0, 1, 2, 3)
  c.mesh.enabled = True
  c.mesh.data = 1
  c.mesh.fsdp = -1
  c.mesh.tensor = 1
  c.optim.learning_rate = 1e-6
  c.learner.num_minibatches = 4
  c.learner.mu = 2
  c.checkpoint.every = 20
  c.metrics.episode_dump_every = 10
  return c
