"""Decode throughput of the JAX sampler vs transformers' `generate()` on the embedded SmolLM2-135M-Instruct.

Both load the same GGUF file (ours through `load_pretrained`, transformers through its GGUF support), decode the
same prompts greedily for a fixed number of new tokens (stop ids ignored) at each batch size, and are timed after
a warm-up call (compilation excluded). Prints tokens/s of each and the ratio. Our sampler gets the cache size
the main job gives it (`rollout.max_context_len`); a call holds and reads only the slots its positions reach.

  python bench/sampler.py [--batch_sizes 1,16] [--new_tokens 256] [--cache_len 3072] [--repeats 1]
      [--samples G] [--long_prompts]

`--samples G` decodes batch / G prompts G times each (one prefill per prompt, as a rollout group does);
`--long_prompts` makes each prompt about 700 tokens, as long as a task prompt.
"""
import argparse
import os
import sys
import time

import jax
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from leap_jax.models import embedded_gguf_path, load_pretrained  # noqa: E402
from leap_jax.sampling import ChatFormat, Sampler, SamplingParams, bucket_length  # noqa: E402

QUESTIONS = [
    "Write a CUDA kernel that adds two vectors.", "Explain shared memory bank conflicts.",
    "Write a ReLU kernel in CUDA.", "What is warp divergence?", "Fuse a matmul with a bias add.",
    "Write a softmax kernel for rows of 1024 floats.", "How do I time a kernel with CUDA events?",
    "Write a transpose kernel using shared memory.", "What does __syncthreads do?",
    "Write a reduction kernel for a float sum.", "Explain coalesced global memory access.",
    "Write a kernel for elementwise GELU.", "What is occupancy?", "Write a layer norm kernel.",
    "How do tensor cores help matmuls?", "Write a kernel that clamps values to [0, 1].",
]


def prompts_for(chat: ChatFormat, batch: int, long: bool) -> list[list[int]]:
  preamble = " ".join(QUESTIONS) * 4 if long else ""
  return [chat.first_turn(preamble + QUESTIONS[i % len(QUESTIONS)]) for i in range(batch)]


def time_ours(graphdef, state, cfg, prompts, new_tokens, repeats, cache_len, samples):
  sampler = Sampler(graphdef, cfg, cache_len=cache_len, stop_ids=())
  greedy = SamplingParams(temperature=0.0)
  run = lambda: sampler.start(state, prompts, samples, jax.random.key(0), max_new_tokens=new_tokens,
                              sampling=greedy)
  run()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    _, outs = run()
    best = min(best, time.perf_counter() - t)
  assert all(len(c.tokens) == new_tokens for c in outs)
  return len(outs) * new_tokens / best, [c.tokens for c in outs]


def time_transformers(model, pad_id, prompts, new_tokens, repeats):
  import torch
  width = max(len(p) for p in prompts)
  ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
  mask = torch.zeros((len(prompts), width), dtype=torch.long)
  for i, p in enumerate(prompts):  # left padding, as decoder-only generation needs
    ids[i, width - len(p):] = torch.tensor(p)
    mask[i, width - len(p):] = 1
  kwargs = dict(attention_mask=mask, do_sample=False, pad_token_id=pad_id, eos_token_id=None)
  with torch.inference_mode():
    model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kwargs)
    best = float("inf")
    for _ in range(repeats):
      t = time.perf_counter()
      out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
      best = min(best, time.perf_counter() - t)
  return len(prompts) * new_tokens / best, out[:, width:].numpy()


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch_sizes", default="1,16")
  parser.add_argument("--new_tokens", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--cache_len", type=int, default=3072, help="the sampler's slots per row")
  parser.add_argument("--samples", type=int, default=1, help="completions per distinct prompt")
  parser.add_argument("--long_prompts", action="store_true", help="prompts of about 700 tokens")
  parser.add_argument("--skip_transformers", action="store_true")
  args = parser.parse_args()
  model, tokenizer = load_pretrained("smollm2-135m-instruct")
  cfg = model.config
  graphdef, state = nnx.split(model)
  chat = ChatFormat(tokenizer)
  hf_model = None
  if not args.skip_transformers:
    import torch
    from transformers import AutoModelForCausalLM
    path = embedded_gguf_path("smollm2-135m-instruct")
    hf_model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                    dtype=torch.float32).eval()
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPUs; "
        f"{args.new_tokens} new tokens, greedy, compile excluded, cache of {args.cache_len} slots")
  for batch in [int(b) for b in args.batch_sizes.split(",")]:
    prompts = prompts_for(chat, max(1, batch // args.samples), args.long_prompts)
    rows = [p for p in prompts for _ in range(args.samples)]
    cache_len = max(args.cache_len, bucket_length(max(len(p) for p in prompts)) + args.new_tokens)
    ours, our_tokens = time_ours(graphdef, state, cfg, prompts, args.new_tokens, args.repeats, cache_len,
                                 args.samples)
    line = f"batch {batch:3d}: leap_jax {ours:8.1f} tok/s"
    if hf_model is not None:
      theirs, their_tokens = time_transformers(hf_model, tokenizer.pad_token_id, rows, args.new_tokens,
                                               args.repeats)
      agree = np.mean([np.mean(np.asarray(a[:16]) == b[:16]) for a, b in zip(our_tokens, their_tokens)])
      line += (f" | transformers {theirs:8.1f} tok/s | ratio {ours / theirs:5.2f}x"
               f" | first-16-token greedy agreement {agree:.2f}")
    print(line, flush=True)


if __name__ == "__main__":
  main()
