"""GPU check of the learner: one train step of a randomly initialised Qwen2.5-1.5B-shaped policy in bf16.

  python -m leap_jax.train.gpu_section OUT_DIR

Reports compile time, seconds per step, trained tokens per second and peak device memory, and writes
them to `OUT_DIR/gpu_learner.json`. Without a GPU it prints `not_run: no GPU`; when a package the
learner needs cannot be imported it reports which one.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time

# Qwen2.5-1.5B architecture (config.json of the public checkpoint); weights are random here.
QWEN25_1P5B = dict(
    model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
    num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0,
    rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu")
BATCH, LENGTH, PROMPT = 8, 1024, 256
TIMED_STEPS = 3


def _missing_packages() -> list[str]:
  missing = []
  for name in ("jax", "flax", "optax", "ml_collections"):
    try:
      importlib.import_module(name)
    except ImportError as e:
      missing.append(f"{name} ({e})")
  return missing


def _gpu_devices():
  import jax  # pylint: disable=g-import-not-at-top
  try:
    return jax.devices("gpu")
  except RuntimeError:
    return []


def _write(out_dir: str, result: dict) -> dict:
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "gpu_learner.json"), "w") as f:
    json.dump(result, f, indent=2)
  return result


def run(out_dir: str) -> dict:
  """Times one learner step on one GPU; returns (and writes) the measurements or the reason it did not run."""
  missing = _missing_packages()
  if missing:
    reason = "missing packages: " + ", ".join(missing)
    print(f"not_run: {reason}")
    return _write(out_dir, {"status": "not_run", "reason": reason})
  if not _gpu_devices():
    print("not_run: no GPU")
    return _write(out_dir, {"status": "not_run", "reason": "no GPU"})

  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from configs import common  # pylint: disable=g-import-not-at-top
  from leap_jax.models import ModelConfig, Transformer  # pylint: disable=g-import-not-at-top
  from leap_jax.train import learner as learner_lib  # pylint: disable=g-import-not-at-top
  from leap_jax.train import optim  # pylint: disable=g-import-not-at-top
  from leap_jax.train.batch import batch_from_numpy  # pylint: disable=g-import-not-at-top

  device = _gpu_devices()[0]
  cfg = ModelConfig.from_hf_config(QWEN25_1P5B, dtype="bfloat16", param_dtype="bfloat16", scan_layers=True,
                                   remat="full")
  with jax.default_device(device):
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    optim_cfg, learner_cfg = common.optim(), common.learner()
    learner = learner_lib.Learner(learner_lib.model_logprob_fn(graphdef, chunk_size=256),
                                  optim.make_optimizer(optim_cfg),
                                  learner_lib.LearnerConfig.from_configs(learner_cfg, optim_cfg))
    state = learner.init_state(params, seed=0)
    del params
    rng = np.random.default_rng(0)
    policy_mask = np.zeros((BATCH, LENGTH), bool)
    policy_mask[:, PROMPT:] = True
    batch = batch_from_numpy(
        tokens=rng.integers(0, cfg.vocab_size, (BATCH, LENGTH)), policy_mask=policy_mask,
        advantages=np.repeat(rng.normal(size=(BATCH, 1)), LENGTH, axis=1),
        old_logprobs=np.full((BATCH, LENGTH), -np.log(cfg.vocab_size)))
    batch = jax.device_put(batch, device)
    start = time.perf_counter()
    state, metrics = learner.step(state, batch)
    compile_and_first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(TIMED_STEPS):
      state, metrics = learner.step(state, batch)
    jax.block_until_ready(state)
    per_step = (time.perf_counter() - start) / TIMED_STEPS
  stats = device.memory_stats() or {}
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
  result = {
      "status": "ok",
      "device": str(device.device_kind),
      "jax": jax.__version__,
      "num_params": num_params,
      "batch": BATCH,
      "length": LENGTH,
      "first_step_s": round(compile_and_first, 3),
      "step_s": round(per_step, 4),
      "tokens_per_s": round(BATCH * LENGTH / per_step, 1),
      "policy_tokens_per_s": round(float(policy_mask.sum()) / per_step, 1),
      "peak_memory_gib": round(stats.get("peak_bytes_in_use", 0) / 2**30, 3),
      "loss": metrics["loss"],
      "grad_norm": metrics["grad_norm"],
  }
  print(json.dumps(result))
  return _write(out_dir, result)


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  run(sys.argv[1] if len(sys.argv) > 1 else ".")
