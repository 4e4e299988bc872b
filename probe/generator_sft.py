"""Cold start for the task generator: supervised fine-tuning on the suite's own task files.

PROPEL starts from an instruct model that already writes tasks in the requested format. A small model does not
(the embedded 135M model answers the generator prompt with prose), so, like the LEAP policy, the generator first
learns the format: each example is the generator prompt for one seed, with `num_shots` suite tasks that exclude
the target, followed by the target task file (solutions removed) in a fenced block. The fine-tuned model is the
frozen reference generator of the corpus, the probe features and the KL term, and the start of generator RL.

Loss and gradient modes: `leap_jax.train.sft` (reply tokens only; `prompt_grad=False` prefills the prompt
without gradient).
"""
from __future__ import annotations

import pathlib
import time
from typing import Any, Callable, Sequence

import numpy as np

from leap_jax.train import sft as sft_lib
from probe import generator as generator_lib


def sft_examples(examples: Sequence[str], chat, tokenizer, *, num_shots: int, levels: Sequence[int],
                 seed: int, per_task: int = 1) -> list[sft_lib.SFTExample]:
  """`per_task` examples per suite task: prompt with `num_shots` other tasks (drawn by seed), reply = the task.

  Args:
    examples: task files without solutions (`generator.suite_examples(levels)`); at least num_shots + 1.
    chat, tokenizer: the generator's ChatFormat and tokenizer.
    num_shots, levels: as in `generator.generator_prompt`.
    seed: draws the shots.
    per_task: prompts (different shots) per target task.
  """
  if len(examples) <= num_shots:
    raise ValueError(f"generator SFT needs more than num_shots={num_shots} suite tasks, got {len(examples)}")
  rng = np.random.default_rng(seed)
  out = []
  for i, target in enumerate(examples):
    others = [e for j, e in enumerate(examples) if j != i]
    for _ in range(per_task):
      prompt = generator_lib.generator_prompt(others, num_shots=num_shots, seed=int(rng.integers(1 << 31)),
                                              levels=levels)
      reply = f"```python\n{target.strip()}\n```"
      out.append(sft_lib.make_example(f"task{i}", chat.first_turn(prompt), reply, tokenizer, chat.stop_ids[0]))
  return out


def cold_start(model, tokenizer, chat, out_dir: str | pathlib.Path, *, levels: Sequence[int], num_shots: int,
               steps: int, batch_size: int, optimizer, seed: int, per_task: int = 1,
               echo: Callable[[str], None] = print) -> dict[str, Any]:
  """Fine-tunes `model` in place on the suite tasks at `levels` and writes it as a HF folder `out_dir`."""
  from leap_jax.models.hf_io import save_hf_checkpoint  # pylint: disable=import-outside-toplevel
  started = time.perf_counter()
  examples = sft_examples(generator_lib.suite_examples(levels), chat, tokenizer, num_shots=num_shots,
                          levels=levels, seed=seed, per_task=per_task)
  echo(f"generator SFT on {len(examples)} prompt/task pairs (levels {tuple(levels)}), {steps} steps x "
       f"{batch_size}, longest {max(len(e) for e in examples)} tokens")

  def log(step, m):
    echo(f"generator sft step {step + 1}/{steps} nll {m['nll']:.4f} grad_norm {m['grad_norm']:.2f} "
         f"({m['seconds']:.0f} s)")

  history = sft_lib.run_sft(model, examples, optimizer, steps=steps, batch_size=batch_size, seed=seed,
                            prompt_grad=False, log=log)
  save_hf_checkpoint(model, tokenizer, out_dir)
  return {"examples": len(examples), "final_nll": history[-1]["nll"], "seconds": time.perf_counter() - started,
          "dir": str(out_dir)}
