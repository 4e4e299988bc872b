"""Learner throughput on the embedded SmolLM2-135M-Instruct: per-episode vs shared-prefix vs transformers + torch.

One group of G episodes: a shared prompt of P tokens, then answers of 100-300 tokens (seeded), all answer tokens
trained. Each path runs one learner step on the same batch: ours is `Learner.step` (forward, backward through the
remat'd layers and the Adam update, as `make train` runs it) with `learner.shared_prefix` off (every episode runs
the prompt) and on (the prompt runs once per group); torch is transformers' forward and backward of the same
weights on the same padded rows, layers checkpointed and log-probs chunked as ours are, plus an AdamW step. Prints
trained (answer) tokens per second after a warm-up step (compilation excluded, reported apart) and the ratios.

  python bench/learner.py [--groups 4,8] [--prompts 700,2000] [--repeats 1] [--skip_torch]
"""
import argparse
import os
import sys
import time

import jax
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from leap_jax.metrics.compile_time import compile_seconds  # noqa: E402
from leap_jax.models import embedded_gguf_path, load_pretrained  # noqa: E402
from leap_jax.sampling.buckets import bucket  # noqa: E402
from leap_jax.train.batch import batch_from_numpy  # noqa: E402
from leap_jax.train.learner import Learner, LearnerConfig  # noqa: E402

ANSWERS = (100, 300)


def make_batch(group: int, prompt: int, vocab: int, seed: int = 0):
  """One group: the shared prompt then answers of 100-300 tokens; answers trained, sampler log-probs -1."""
  rng = np.random.default_rng(seed)
  answers = rng.integers(ANSWERS[0], ANSWERS[1] + 1, group)
  length = bucket(prompt + int(answers.max()), 16)
  tokens = np.zeros((group, length), np.int32)
  policy = np.zeros((group, length), bool)
  tokens[:, :prompt] = rng.integers(3, vocab, prompt)
  for g, n in enumerate(answers):
    tokens[g, prompt:prompt + n] = rng.integers(3, vocab, n)
    policy[g, prompt:prompt + n] = True
  advantages = np.where(policy, rng.normal(size=(group, 1)), 0.0)
  return batch_from_numpy(tokens, policy, advantages, np.where(policy, -1.0, 0.0),
                          input_mask=tokens > 0, group_ids=np.zeros(group, np.int32))


def time_ours(graphdef, params, batch, shared: bool, repeats: int) -> tuple[float, float, dict]:
  """(seconds per step, compile seconds, last metrics) of `Learner.step` with shared_prefix on or off."""
  learner = Learner.for_model(graphdef, optax.adam(1e-6), LearnerConfig(shared_prefix=shared))
  state = learner.init_state(params, seed=0)
  compiled = compile_seconds()
  state, metrics = learner.step(state, batch)
  compile_s = compile_seconds() - compiled
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    state, metrics = learner.step(state, batch)
    times.append(time.perf_counter() - t)
  return float(np.median(times)), compile_s, metrics


def time_torch(model, batch, repeats: int, chunk: int = 256) -> float:
  """Seconds per forward + backward + AdamW step of transformers on the same rows (policy-gradient surrogate),
  computed as ours is: layers checkpointed (remat full) and log-probs in chunks of `chunk` positions, each
  chunk's logits recomputed in the backward pass (ours: `chunked_logprobs`)."""
  import torch
  from torch.utils.checkpoint import checkpoint
  tokens = torch.as_tensor(np.asarray(batch.tokens), dtype=torch.long)
  attention = torch.as_tensor(np.asarray(batch.input_mask), dtype=torch.long)
  weight = torch.as_tensor(np.asarray(batch.advantages) * np.asarray(batch.policy_mask), dtype=torch.float32)
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
  model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

  def chunk_logprobs(hidden, targets):
    return torch.log_softmax(model.lm_head(hidden).float(), -1).gather(-1, targets[..., None])[..., 0]

  def step():
    hidden = model.model(input_ids=tokens, attention_mask=attention).last_hidden_state[:, :-1]
    targets, w = tokens[:, 1:], weight[:, 1:]
    total = 0.0
    for s in range(0, hidden.shape[1], chunk):
      logp = checkpoint(chunk_logprobs, hidden[:, s:s + chunk], targets[:, s:s + chunk], use_reentrant=False)
      total = total + (logp * w[:, s:s + chunk]).sum()
    loss = -total / w.ne(0).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

  step()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    step()
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def load_torch_model():
  import torch
  from transformers import AutoModelForCausalLM
  path = embedded_gguf_path("smollm2-135m-instruct")
  return AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                              dtype=torch.float32).train()


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--groups", default="4,8")
  parser.add_argument("--prompts", default="700,2000")
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--skip_torch", action="store_true")
  args = parser.parse_args()
  model, _ = load_pretrained("smollm2-135m-instruct", remat="full")
  graphdef, params = nnx.split(model)
  torch_model = None if args.skip_torch else load_torch_model()
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPUs; SmolLM2-135M fp32, remat "
        f"full; answers {ANSWERS[0]}-{ANSWERS[1]} tokens; trained tokens/s, median of {args.repeats} step(s) after "
        f"a warm-up; compile excluded", flush=True)
  for prompt in [int(p) for p in args.prompts.split(",")]:
    for group in [int(g) for g in args.groups.split(",")]:
      batch = make_batch(group, prompt, model.config.vocab_size)
      trained = int(np.asarray(batch.policy_mask).sum())
      rows_s, rows_c, rows_m = time_ours(graphdef, params, batch, False, args.repeats)
      units_s, units_c, units_m = time_ours(graphdef, params, batch, True, args.repeats)
      line = (f"G={group} prompt={prompt}: per-episode {trained / rows_s:7.1f} tok/s ({rows_s:6.1f} s, compile "
              f"{rows_c:4.0f} s) | shared-prefix {trained / units_s:7.1f} tok/s ({units_s:6.1f} s, compile "
              f"{units_c:4.0f} s, positions {units_m['learner/positions']:.0f} vs {rows_m['learner/positions']:.0f})"
              f" | shared/per-episode {rows_s / units_s:5.2f}x")
      if torch_model is not None:
        torch_s = time_torch(torch_model, batch, args.repeats)
        line += f" | torch {trained / torch_s:7.1f} tok/s | shared/torch {torch_s / units_s:5.2f}x"
        line += f" | per-episode/torch {torch_s / rows_s:5.2f}x"
      print(line, flush=True)


if __name__ == "__main__":
  main()
