"""Cold-start supervised fine-tuning on trusted solutions, before RL.

Each example is the exact turn-1 prompt the rollout uses ([system, task] in the chat template)
followed by an assistant reply holding the task's trusted solution in a fenced block and the
stop id that closes an assistant message. The loss is the mean negative log-likelihood of the
reply tokens only:

  L(theta) = - sum_{b,t} m[b,t] log pi_theta(x[b,t] | x[b,<t]) / sum_{b,t} m[b,t]

with m the reply mask. Two gradient modes:
  prompt_grad=True:  the exact gradient through the whole sequence;
  prompt_grad=False: the prompt (all but its last token) is prefilled into a KV cache with
    stop-gradient parameters, and the last prompt token plus the reply run with gradients on top
    of it. The loss is the same; its gradient drops the paths through the prompt's keys and values
    (a truncated gradient). On CPU this costs one forward over the prompt instead of a
    rematerialised forward and backward, about 3-4x less for short replies after long prompts.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import kernels_eval
from leap_jax.models import init_cache
from leap_jax.models.hf_io import save_hf_checkpoint
from leap_jax.rollout import prompts
from leap_jax.sampling import ChatFormat
from leap_jax.sampling.logprobs import sequence_logprobs, token_logprobs
from leap_jax.sampling.shared_prefix import PrefixSplit, pad_split, shared_prefix_logprobs, split_shared_prefix
from leap_jax.train import build
from leap_jax.train import checks
from leap_jax.train import optim
from leap_jax.train import grouping
from leap_jax.train.batch import round_up
from leap_jax.train.config import SftConfig, TrainConfig


@dataclasses.dataclass(frozen=True)
class SFTExample:
  """One prompt / reply pair as token ids (reply ends with the stop id)."""
  task_id: str
  prompt: tuple[int, ...]
  reply: tuple[int, ...]

  def __len__(self) -> int:
    return len(self.prompt) + len(self.reply)


def make_example(task_id: str, prompt_ids: Sequence[int], reply_text: str, tokenizer, stop_id: int) -> SFTExample:
  """Tokenises the reply (no special tokens) and appends the stop id."""
  reply = list(tokenizer.encode(reply_text, add_special_tokens=False)) + [int(stop_id)]
  if not prompt_ids:
    raise ValueError(f"SFT example {task_id!r}: empty prompt")
  return SFTExample(task_id, tuple(int(i) for i in prompt_ids), tuple(reply))


def pack(examples: Sequence[SFTExample], length_multiple: int = 32, pad_id: int = 0) -> dict[str, np.ndarray]:
  """Right-pads examples into tokens int32[B, L] and loss_mask bool[B, L] (True on reply tokens), with
  group_ids int32[B] equal for the examples that share a prompt."""
  if not examples:
    raise ValueError("pack needs at least one example")
  length = round_up(max(len(e) for e in examples), length_multiple)
  B = len(examples)
  tokens = np.full((B, length), pad_id, np.int32)
  loss_mask = np.zeros((B, length), bool)
  for i, e in enumerate(examples):
    n, k = len(e), len(e.prompt)
    tokens[i, :n] = e.prompt + e.reply
    loss_mask[i, k:n] = True
  prompts_seen: dict[tuple[int, ...], int] = {}
  group_ids = np.array([prompts_seen.setdefault(e.prompt, len(prompts_seen)) for e in examples], np.int32)
  return {"tokens": tokens, "loss_mask": loss_mask, "group_ids": group_ids}


def prompt_split(packed: dict[str, np.ndarray]) -> PrefixSplit:
  """The shared-prefix layout of a `pack` batch: one prefix per distinct prompt, sizes on `buckets.bucket`'s
  ladder (few compiled shapes)."""
  split = split_shared_prefix(packed["tokens"], packed["group_ids"], packed["loss_mask"], multiple=1)
  return pad_split(split, *grouping.ladder_shape((split.num_groups, split.group_size, split.prefix_width,
                                                  split.suffix_width)))


def pack_split(examples: Sequence[SFTExample], length_multiple: int = 32, pad_id: int = 0
               ) -> dict[str, np.ndarray]:
  """Prompt / reply split for prompt_grad=False.

  Returns:
    prefix int32[B, Lp]: prompt minus its last token, right-padded.
    prefix_len int32[B].
    segment int32[B, Ls]: last prompt token, then the reply, right-padded.
    target_mask bool[B, Ls]: True where segment token i+1 is a reply token (the loss positions).
  """
  if not examples:
    raise ValueError("pack_split needs at least one example")
  if min(len(e.prompt) for e in examples) < 2:
    raise ValueError("pack_split needs prompts of at least 2 tokens")
  B = len(examples)
  lp = round_up(max(len(e.prompt) - 1 for e in examples), length_multiple)
  ls = round_up(max(len(e.reply) + 1 for e in examples), 8)
  prefix = np.full((B, lp), pad_id, np.int32)
  segment = np.full((B, ls), pad_id, np.int32)
  target_mask = np.zeros((B, ls), bool)
  for i, e in enumerate(examples):
    prefix[i, :len(e.prompt) - 1] = e.prompt[:-1]
    segment[i, :len(e.reply) + 1] = (e.prompt[-1],) + e.reply
    target_mask[i, :len(e.reply)] = True
  return {"prefix": prefix, "prefix_len": np.array([len(e.prompt) - 1 for e in examples], np.int32),
          "segment": segment, "target_mask": target_mask}


def _reply_logprobs_truncated(graphdef, params, batch):
  """f32[B, Ls] log-probs of segment token i+1 at i, the prompt prefix prefilled without gradient."""
  prefix, segment = batch["prefix"], batch["segment"]
  B, lp = prefix.shape
  frozen = nnx.merge(graphdef, jax.lax.stop_gradient(params))
  cache = init_cache(frozen.config, B, lp + segment.shape[1])
  positions = jnp.broadcast_to(jnp.arange(lp, dtype=jnp.int32), (B, lp))
  cache = jax.lax.stop_gradient(frozen(prefix, positions, cache, return_logits=False).cache)
  model = nnx.merge(graphdef, params)
  seg_positions = batch["prefix_len"][:, None] + jnp.arange(segment.shape[1], dtype=jnp.int32)[None, :]
  out = model(segment, seg_positions, cache, return_logits=True)
  targets = jnp.concatenate([segment[:, 1:], segment[:, :1]], axis=1)
  return token_logprobs(out.logits, targets)


def make_train_step(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation, prompt_grad: bool = True,
                    chunk_size: int = 256
                    ) -> Callable[[Any, Any, dict[str, jax.Array]], tuple[Any, Any, dict[str, jax.Array]]]:
  """Jitted (params, opt_state, batch) -> (params, opt_state, metrics) for the reply NLL above.

  `batch` comes from `pack` (prompt_grad=True; with "split", a `prompt_split` of it, each distinct prompt runs
  once: the same loss and gradients) or `pack_split` (prompt_grad=False).
  """

  def loss_fn(params, batch):
    if prompt_grad:
      mask = batch["loss_mask"]
      if "split" in batch:
        logp = shared_prefix_logprobs(graphdef, params, batch["tokens"], mask, batch["split"], chunk_size=chunk_size)
      else:
        logp = sequence_logprobs(graphdef, params, batch["tokens"], mask, chunk_size=chunk_size)
    else:
      mask = batch["target_mask"]
      logp = _reply_logprobs_truncated(graphdef, params, batch)
    n = jnp.maximum(mask.sum(), 1)
    nll = -jnp.sum(jnp.where(mask, logp, 0.0)) / n
    # Token accuracy proxy: share of reply tokens whose log-prob exceeds log(1/2) (the argmax for sure).
    confident = jnp.sum(mask & (logp > jnp.log(0.5))) / n
    return nll, {"nll": nll, "confident_tokens": confident}

  def step(params, opt_state, batch):
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    metrics["grad_norm"] = optax.global_norm(grads)
    return optax.apply_updates(params, updates), opt_state, metrics

  return jax.jit(step, donate_argnums=(0, 1))


def run_sft(model: nnx.Module, examples: Sequence[SFTExample], optimizer: optax.GradientTransformation, *,
            steps: int, batch_size: int, seed: int, prompt_grad: bool = True,
            log: Callable[[int, dict[str, float]], None] | None = None,
            length_multiple: int = 32, shared_prefix: bool = True) -> list[dict[str, float]]:
  """Fine-tunes `model` in place on `examples` for `steps` updates of `batch_size` examples.

  Examples are drawn without replacement from a seeded permutation, reshuffled every epoch. With prompt_grad
  and `shared_prefix`, examples of a batch that share a prompt run it once (`prompt_split`).
  Returns one metrics dict per step (nll, confident_tokens, grad_norm, seconds).
  """
  if steps < 1 or batch_size < 1:
    raise ValueError(f"SFT steps and batch_size must be >= 1, got {steps} and {batch_size}")
  if not examples:
    raise ValueError("SFT has no examples: check sft.levels / sft.task_ids and the task split")
  graphdef, params = nnx.split(model)
  opt_state = optimizer.init(params)
  train_step = make_train_step(graphdef, optimizer, prompt_grad)
  packer = pack if prompt_grad else pack_split
  rng = np.random.default_rng(seed)
  order: list[int] = []
  history = []
  for step in range(steps):
    picked = []
    while len(picked) < batch_size:
      if not order:
        order = list(rng.permutation(len(examples)))
      picked.append(examples[order.pop()])
    packed = packer(picked, length_multiple)
    batch = {k: jnp.asarray(v) for k, v in packed.items() if k != "group_ids"}
    if prompt_grad and shared_prefix:
      batch["split"] = prompt_split(packed)
    started = time.perf_counter()
    params, opt_state, metrics = train_step(params, opt_state, batch)
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    metrics["seconds"] = time.perf_counter() - started
    history.append(metrics)
    if log is not None:
      log(step, metrics)
  nnx.update(model, params)
  return history


def sft_tasks(sft: SftConfig, lang: str) -> list:
  """Train-split tasks of `sft.levels` plus `sft.extra_ids`, minus `sft.exclude_ids`, each with a trusted
  solution in `lang`."""
  tasks = build.select_tasks(lang, sft.levels, "train")
  if sft.extra_ids:
    extra = build.select_tasks(lang, (0, 1, 2, 3), "train", sft.extra_ids)
    tasks += [t for t in extra if t not in tasks]
  unknown = sorted(set(sft.exclude_ids) - {t.id for t in kernels_eval.load_tasks()})
  if unknown:
    raise ValueError(f"sft.exclude_ids has unknown task ids {unknown}")
  tasks = [t for t in tasks if t.id not in set(sft.exclude_ids)]
  if not tasks:
    raise ValueError("sft.levels, sft.extra_ids and sft.exclude_ids leave no SFT task")
  return tasks


def build_examples(tasks: Sequence[Any], chat, tokenizer, lang: str) -> list[SFTExample]:
  """Prompt = the rollout's turn-1 [system, task] chat prompt; reply = what the contract asks for, from the
  trusted solution (level 0: the lines that complete the skeleton; otherwise the whole source), fenced."""
  system = prompts.system_message(lang)
  return [make_example(t.id, chat.first_turn(kernels_eval.render_task(t, lang), system),
                       prompts.trusted_reply(t, lang), tokenizer, chat.stop_ids[0])
          for t in tasks]


# KernelBench problems carry no trusted solutions: SFT examples always come from the embedded suite, whose
# CUDA solutions are this project's launch functions, not KernelBench's ModelNew answer format.
KERNELBENCH_CUDA_SFT = ("sft.enabled with tasks.kernelbench_dir and tasks.lang='cuda': SFT examples come from the "
                        "embedded suite, whose CUDA solutions are not in KernelBench's ModelNew answer format; set "
                        "sft.enabled=False (RL starts from model.base) or tasks.lang='pallas'")


def cold_start(config: TrainConfig, echo: Callable[[str], None] = print, measure: bool = False,
               evaluator=None) -> dict[str, Any]:
  """Fine-tunes `model.base` on the SFT tasks and saves a HF folder at `sft.checkpoint_dir`.

  With `measure`, afterwards measures the turn-1 pass rate on the RL task pool (`tasks`) with `evaluator`
  (default: one built from `config.evaluator`). Returns {"steps", "seconds", "final_nll", "examples",
  "train_seconds", "dir", and "pass_rate@1", "per_task" when measured}.
  """
  started = time.perf_counter()
  sft, lang = config.sft, config.tasks.lang
  if config.tasks.kernelbench_dir and lang == "cuda":
    raise ValueError(KERNELBENCH_CUDA_SFT)
  model, tokenizer = build.load_model(config.model, config.seed)
  tasks = sft_tasks(sft, lang)
  examples = build_examples(tasks, ChatFormat(tokenizer), tokenizer, lang)
  echo(f"SFT on {len(examples)} tasks ({', '.join(t.id for t in tasks)}), "
       f"{sft.steps} steps x {sft.batch_size} examples, longest {max(len(e) for e in examples)} tokens")

  def log(step, m):
    echo(f"sft step {step + 1}/{sft.steps} nll {m['nll']:.4f} confident {m['confident_tokens']:.2f} "
         f"grad_norm {m['grad_norm']:.2f} ({m['seconds']:.0f} s)")

  history = run_sft(model, examples, optim.make_optimizer(sft.optim), steps=sft.steps, batch_size=sft.batch_size,
                    seed=config.seed, prompt_grad=sft.prompt_grad, log=log)
  out_dir = pathlib.Path(sft.checkpoint_dir)
  save_hf_checkpoint(model, tokenizer, out_dir)
  summary: dict[str, Any] = {"steps": sft.steps, "examples": len(examples), "final_nll": history[-1]["nll"],
                             "train_seconds": sum(h["seconds"] for h in history), "dir": str(out_dir)}
  if measure:
    summary.update(measure_pool(config, build.Policy.from_model(model, tokenizer, config.rollout.max_context_len),
                                evaluator, echo))
  summary["seconds"] = time.perf_counter() - started
  (out_dir / "sft_summary.json").write_text(json.dumps(summary, indent=2))
  return summary


def measure_pool(config: TrainConfig, policy: build.Policy, evaluator, echo: Callable[[str], None]) -> dict[str, Any]:
  """{"pass_rate@1", "per_task"} of `policy` on the RL task pool (turn 1, `precheck.samples_per_task`)."""
  pool = build.pool_tasks(config.tasks)
  rollouts = build.Rollouts.of(config)
  with contextlib.ExitStack() as stack:
    if evaluator is None:
      evaluator = stack.enter_context(build.make_evaluator(config.evaluator))
    check = checks.turn1_pass_rate(rollouts, policy, evaluator, pool, config.precheck.samples_per_task)
  echo(f"turn-1 pass rate after SFT: {check['pass_rate@1']:.3f} on {len(pool)} pool tasks")
  return {"pass_rate@1": check["pass_rate@1"], "per_task": check["per_task"]}
