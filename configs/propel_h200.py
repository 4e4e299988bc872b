"""PROPEL at paper scale on one H200: thousands of labelled tasks, K = 8, RVP over 512 samples.

The generator is a local HF folder of an instruct model of a few billion parameters, which writes the task format
as asked without a cold-start SFT; it is required (the embedded 135M model answers in prose without its SFT):

  python launch/build_corpus.py --config configs/propel_h200.py --config.generator.model.base=/path/to/HF-folder
"""
import ml_collections

from configs import propel_cpu


def get_config() -> ml_collections.ConfigDict:
  c = propel_cpu.get_config()
  c.scale = "paper"
  c.workdir = "workdirs/propel_h200"
  c.generator.model.base = ""  # required: --config.generator.model.base=<local HF folder> (probe/pipeline.py checks)
  c.generator.model.dtype = "bfloat16"
  c.generator.levels = (1, 2, 3)
  c.generator.num_shots = 2
  c.generator.temperature = 1.0
  c.generator.max_context_len = 4096
  c.generator.sft.enabled = False  # an instruct model of a few billion parameters writes the format as asked
  c.generator.max_new_tokens = 1024
  c.generator.batch_size = 64
  c.solver.model.base = "workdirs/h200/policy"  # the LEAP policy of configs/h200.py
  c.solver.model.dtype = "bfloat16"
  c.solver.max_new_tokens = 2048
  c.solver.attempts = 8
  c.evaluator.workers = 8
  c.corpus.num_tasks = 4000
  c.corpus.band = (1, 3)  # PROPEL: 1..3 of 8
  c.probe.layers = (6, 10, 14)
  c.probe.l2s = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
  c.probe.rvp_samples = 512
  c.rl.steps = 200
  c.rl.num_prompts = 16
  c.rl.group_size = 8
  c.rl.audit_every = 25
  c.rl.audit_tasks = 256
  c.optim.learning_rate = 1e-6
  c.checkpoint.every = 25
  c.checkpoint.async_save = True
  return c
