"""GPU check of the learner: train steps of a randomly initialised Qwen2.5-1.5B-shaped policy in bf16, per
episode and with each group's shared prompt run once (`learner.shared_prefix`).

  python -m leap_jax.train.gpu_section OUT_DIR [--dry-run]

Measurements, in order; each is skipped as {"skipped": "time budget"} once the deadline has passed, and
OUT_DIR/gpu_learner.json is rewritten after each one:

  matmul      the device's bf16 matmul rate: [n, n] @ [n, n] with n = 8192, 10 calls back to back after a
              warm-up: tflops = 2 n^3 / seconds / 1e12.
  then, for each layout in (per_episode, shared_prefix), `<layout>_first_step` and `<layout>_steps`:
  first_step  builds the policy (scanned layers, remat "full"), the learner with the library's defaults
              (`LearnerConfig()`, `optim.make_optimizer(OptimConfig())`) and its state, commits state and
              batch to the device (so the donated state comes back with the same shardings and later steps
              reuse the executable), then runs one step: compile_s (trace + lowering + XLA compile, from
              `jax.monitoring`), first_step_s (its wall time), setup_s (building all of it).
  steps       up to 5 more steps, each timed to completion (the deadline is checked before each):
              step_s (median), tokens_per_s = B L / step_s, policy_tokens_per_s, recompiles (0 expected),
              peak_memory_gib (the process's peak: earlier sections of the same process count too), and
              model FLOPs utilisation (PaLM, arXiv 2204.02311, App. B):

                F = 6 N B L + 12 n_layers H d L (B L)          model FLOPs per step
                N = every parameter but the input embedding table (a gather), plus the output projection
                    V D (the tied embedding table, counted once)
                mfu_measured = F / step_s / (matmul tflops),  mfu_datasheet = F / step_s / 989e12 (H200 dense
                bf16; None on other devices)

              The attention term counts the full L x L scores (the model computes them and masks). In the
              shared-prefix layout (U units of a prefix of Lp and R suffixes of Ls positions) the same
              formula runs over what that layout computes: T = U (Lp + R Ls) positions and U (Lp^2 +
              R Ls (Lp + Ls)) attention pairs in place of L T. tokens_per_s counts the batch's B L tokens
              in both layouts, so its ratio is the speedup. MFU counts
              model FLOPs only: remat recomputes every layer's forward in the backward pass (about 2 N per
              token more), which F leaves out, so the hardware FLOPs utilisation is about 8/6 of the MFU.

One step is one forward and backward over the batch (mu = 1, one minibatch, no TIS or reference forward): groups
of G episodes sharing a prompt of `prompt` tokens, answers of ragged lengths up to L.
A measurement that raises is recorded as {"error": traceback} and makes the status "error". `dry_run=True`
runs all of it on tiny shapes on whatever device there is (status "dry_run"). Without a GPU (and without
`dry_run`) it prints and writes `not_run: no GPU`. Needs jax, flax, optax and numpy only.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from leap_jax.models import ModelConfig
from leap_jax.sampling.gpu_section import (SHORT_CALL_REPEATS, CompileWatch, Report, random_model, section_device,
                                           timed_calls)
from leap_jax.models.architectures import QWEN25_1P5B
from leap_jax.train import learner as learner_lib
from leap_jax.train import optim
from leap_jax.train.batch import TrainBatch, batch_from_numpy

FILE_NAME = "gpu_learner.json"
# Dense bf16 tensor-core peak in FLOP/s by device kind (substring of `device_kind`), from the datasheet.
PEAK_BF16_FLOPS = {"H200": 989e12}

TINY = dict(
    model_type="qwen2", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)


@dataclasses.dataclass(frozen=True)
class Shapes:
  """What the section measures: the model (HF config fields), the batch [B, L] and the matmul size n."""
  model: dict
  batch: int
  length: int
  prompt: int
  group: int
  timed_steps: int
  matmul_n: int
  chunk_size: int


FULL = Shapes(QWEN25_1P5B, batch=8, length=1024, prompt=768, group=8, timed_steps=5, matmul_n=8192,
              chunk_size=256)
DRY_RUN = Shapes(TINY, batch=4, length=32, prompt=16, group=2, timed_steps=2, matmul_n=128, chunk_size=64)
LAYOUTS = ("per_episode", "shared_prefix")


def matmul_rate(n: int, repeats: int = SHORT_CALL_REPEATS) -> dict:
  """bf16 [n, n] @ [n, n] (f32 accumulation): tflops = 2 n^3 / seconds / 1e12."""
  a, b = jax.random.normal(jax.random.key(0), (2, n, n), jnp.bfloat16)
  entry, _ = timed_calls(jax.jit(jnp.matmul), (a, b), repeats)
  return {"n": n, **entry, "tflops": 2 * n**3 / entry["seconds"] / 1e12}


def flop_params(cfg: ModelConfig, num_params: int) -> int:
  """N: all parameters but the input embedding table, plus the output projection V D (tied: the same table)."""
  return num_params if cfg.tie_word_embeddings else num_params - cfg.vocab_size * cfg.hidden_size


def model_flops(cfg: ModelConfig, n: int, batch: int, length: int) -> float:
  """F = 6 N T + 12 n_layers H d L T with T = B L tokens: forward and backward, full L x L attention."""
  tokens = batch * length
  return 6 * n * tokens + 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * length * tokens


def layout_flops(cfg: ModelConfig, n: int, units: int, rows: int, prefix: int, suffix: int) -> float:
  """F of the shared-prefix layout: 6 N T + 12 n_layers H d A, T = U (Lp + R Ls) positions and
  A = U (Lp^2 + R Ls (Lp + Ls)) attention pairs."""
  positions = units * (prefix + rows * suffix)
  pairs = units * (prefix**2 + rows * suffix * (prefix + suffix))
  return 6 * n * positions + 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * pairs


def random_batch(shapes: Shapes, vocab_size: int) -> TrainBatch:
  """B episodes of L positions in groups of G: a shared random prompt of `prompt` tokens (untrained), then each
  episode's own answer of (L - prompt) / 4 .. L - prompt random tokens, one random advantage per episode."""
  rng = np.random.default_rng(0)
  B, L, P = shapes.batch, shapes.length, shapes.prompt
  tokens = np.zeros((B, L), np.int64)
  policy_mask = np.zeros((B, L), bool)
  for b in range(B):
    if b % shapes.group == 0:
      prompt = rng.integers(1, vocab_size, P)
    end = P + int(rng.integers((L - P) // 4, L - P + 1))
    tokens[b, :P], tokens[b, P:end] = prompt, rng.integers(1, vocab_size, end - P)
    policy_mask[b, P:end] = True
  return batch_from_numpy(
      tokens=tokens, policy_mask=policy_mask, input_mask=tokens > 0,
      advantages=np.repeat(rng.normal(size=(B, 1)), L, axis=1) * policy_mask,
      old_logprobs=np.full((B, L), -np.log(vocab_size)), group_ids=np.arange(B) // shapes.group)


class _Bench:
  """The learner, its train state and one batch (in `layout`) on `device`: `first_step`, then `timed_steps`."""

  def __init__(self, shapes: Shapes, device, layout: str = "per_episode"):
    self.shapes = shapes
    self.device = device
    self.layout = layout
    self.cfg = ModelConfig.from_hf_config(shapes.model, dtype="bfloat16", param_dtype="bfloat16",
                                          scan_layers=True, remat="full")

  def _build(self) -> None:
    graphdef, params = random_model(self.cfg, self.device)
    self.num_params = int(sum(x.size for x in jax.tree.leaves(params)))
    config = learner_lib.LearnerConfig(shared_prefix=self.layout == "shared_prefix")
    self.learner = learner_lib.Learner.for_model(graphdef, optim.make_optimizer(optim.OptimConfig()), config,
                                                 chunk_size=self.shapes.chunk_size)
    # Committed: the step's donated outputs are committed, so uncommitted inputs would compile it twice.
    self.state = jax.device_put(self.learner.init_state(params, seed=0), self.device)
    host = random_batch(self.shapes, self.cfg.vocab_size)
    self.policy_tokens = int(np.asarray(host.policy_mask).sum())
    laid_out, self.stats = self.learner.layout(host)  # the shared-prefix units are built on the host
    self.batch = jax.device_put(laid_out, self.device)

  def _step(self) -> tuple[float, dict]:
    """One train step timed to completion: (seconds, metrics)."""
    start = time.perf_counter()
    self.state, metrics = self.learner.step(self.state, self.batch)
    jax.block_until_ready(self.state)
    return time.perf_counter() - start, metrics

  def first_step(self) -> dict:
    start = time.perf_counter()
    self._build()
    setup = time.perf_counter() - start
    with CompileWatch() as watch:
      seconds, metrics = self._step()
    return {"params": self.num_params, "flop_params": flop_params(self.cfg, self.num_params),
            "batch": self.shapes.batch, "length": self.shapes.length, "setup_s": round(setup, 3),
            "compile_s": round(watch.seconds, 3), "compiles": watch.compiles, "first_step_s": round(seconds, 3),
            "loss": metrics["loss"]}

  def timed_steps(self, report: Report) -> dict:
    times = []
    with CompileWatch() as watch:
      while len(times) < self.shapes.timed_steps and (not times or report.time_left()):
        seconds, metrics = self._step()
        times.append(seconds)
    step_s = statistics.median(times)
    return {"steps": len(times), "step_s": step_s, "step_s_all": [round(t, 4) for t in times],
            "recompiles": watch.compiles, **self._rates(step_s, report),
            "peak_memory_gib": _peak_memory_gib(self.device), "loss": metrics["loss"],
            "grad_norm": metrics["grad_norm"]}

  def _rates(self, step_s: float, report: Report) -> dict:
    """Tokens/s and model FLOPs utilisation of a step of `step_s` seconds (module docstring)."""
    n = flop_params(self.cfg, self.num_params)
    if self.layout == "shared_prefix":
      U, R, Ls = self.batch.tokens.shape
      flops = layout_flops(self.cfg, n, U, R, self.batch.prefix_tokens.shape[1], Ls)
    else:
      flops = model_flops(self.cfg, n, self.shapes.batch, self.shapes.length)
    matmul_tflops = report.data.get("matmul", {}).get("tflops")
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in self.device.device_kind), None)
    return {"tokens_per_s": self.shapes.batch * self.shapes.length / step_s,
            "policy_tokens_per_s": self.policy_tokens / step_s, "positions": self.stats.positions,
            "model_tflop_per_step": flops / 1e12, "model_tflops": flops / step_s / 1e12,
            "mfu_measured": flops / step_s / 1e12 / matmul_tflops if matmul_tflops else None,
            "mfu_datasheet": flops / step_s / peak if peak else None}


def _peak_memory_gib(device) -> float | None:
  stats = device.memory_stats() or {}
  return round(stats["peak_bytes_in_use"] / 2**30, 3) if "peak_bytes_in_use" in stats else None


def run(out_dir: str | os.PathLike, *, deadline: float | None = None, dry_run: bool = False) -> dict:
  """Measures the figures above into `out_dir`/gpu_learner.json (rewritten after each) and returns them.

  `deadline` is a `time.monotonic()` value; `dry_run` uses tiny shapes on whatever device is present.
  """
  device = section_device(dry_run)
  if device is None:
    print("not_run: no GPU")
    return Report(out_dir, FILE_NAME, deadline, status="not_run", reason="no GPU").data
  report = Report(out_dir, FILE_NAME, deadline, status="dry_run" if dry_run else "ok", device=device.device_kind,
                  jax=jax.__version__)
  shapes = DRY_RUN if dry_run else FULL
  with jax.default_device(device):
    report.measure("matmul", lambda: matmul_rate(shapes.matmul_n))
    for layout in LAYOUTS:
      bench = _Bench(shapes, device, layout)
      if report.measure(f"{layout}_first_step", bench.first_step):
        report.measure(f"{layout}_steps", lambda: bench.timed_steps(report))
      else:
        reason = report.data[f"{layout}_first_step"].get("skipped", "first step failed")
        report.update(**{f"{layout}_steps": {"skipped": reason}})
  steps = [report.data[f"{layout}_steps"].get("step_s") for layout in LAYOUTS]
  if all(steps):
    report.update(shared_prefix_speedup=steps[0] / steps[1])
  return report.data


if __name__ == "__main__":
  run(next((a for a in sys.argv[1:] if not a.startswith("--")), "."), dry_run="--dry-run" in sys.argv)
