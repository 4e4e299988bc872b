"""One H200: a local HF checkpoint (default architecture Qwen2.5-1.5B-Instruct), Pallas-Triton tasks
(CUDA tasks with --config.tasks.lang=cuda), LEAP with P=8, G=8, T=3.

  python launch/train.py --config configs/h200.py --config.model.base=/path/to/Qwen2.5-1.5B-Instruct
"""
import ml_collections

from configs import default

# Qwen2.5-1.5B-Instruct's config.json (architecture only): dry runs and the shape check before loading.
QWEN25_1P5B = {
    "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960,
    "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2, "hidden_act": "silu",
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
    "tie_word_embeddings": True, "bos_token_id": 151643, "eos_token_id": 151645,
}


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
