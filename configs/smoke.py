"""A tiny random model on level-0 tasks, for tests and quick end-to-end checks (seconds per step on CPU).

Uses the embedded model's tokenizer (its chat template) with a 1-layer, 32-wide random decoder.
"""
import ml_collections

from configs import default

TINY_ARCH = {
    "model_type": "llama", "vocab_size": 49152, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 4096, "tie_word_embeddings": True,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
}


def get_config() -> ml_collections.ConfigDict:
  c = default.get_config()
  c.workdir = "workdirs/smoke"
  c.steps = 2
  c.model.base = "random"
  c.model.arch = dict(TINY_ARCH)
  c.model.remat = "none"
  c.tasks.levels = (0,)
  c.rollout.num_problems = 2
  c.rollout.group_size = 2
  c.rollout.num_turns = 2
  c.dcp.t_max = -1  # G (LEAP's reading)
  c.rollout.max_new_tokens = 8
  c.rollout.max_context_len = 2048
  c.rollout.temperature = 1.0
  c.evaluator.workers = 1
  c.sft.enabled = False
  c.sft.steps = 2
  c.sft.batch_size = 2
  c.precheck.enabled = False
  c.heldout.at_end = False
  c.heldout.every = 0
  c.heldout.num_turns = 2
  c.optim.learning_rate = 1e-3
  c.checkpoint.every = 1
  c.checkpoint.async_save = False
  c.metrics.tensorboard = False
  c.metrics.plot_at_end = False
  c.metrics.episodes_per_dump = 4
  return c
