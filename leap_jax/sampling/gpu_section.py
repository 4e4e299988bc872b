"""GPU figures of the sampler on a randomly initialised Qwen2.5-1.5B-shaped model in bf16 (no weights needed).

  python -m leap_jax.sampling.gpu_section OUT_DIR [--dry-run]

Measurements, in order; each is skipped as {"skipped": "time budget"} once the deadline has passed, and
OUT_DIR/gpu_sampler.json is rewritten after each one:

  copy            the device's copy bandwidth: a jitted device-to-device copy of a 2 GiB array after a warm-up,
                    copy_gb_per_s = 2 * bytes / seconds / 1e9   (every byte read once and written once)
  model           builds the random bf16 model in one jitted call: params, param_bytes, init_s.
  prefill         one forward of [B, L] prompts into a fresh cache: tokens_per_s = B L / seconds.
  decode_batch_R  the sampler's own `lax.while_loop` decode, greedy, T new tokens for each of R rows after a
                  P-token prompt: tokens_per_s = R T / seconds. The first token comes from the prompt's logits;
                  each of the T - 1 model steps after it must read every weight and each row's keys and values
                  up to its current length, so
                    bytes = sum_{t=1}^{T-1} (param_bytes + R kv_bytes (P + t)),  kv_bytes = 2 N K d itemsize
                    gb_per_s = bytes / seconds / 1e9,  fraction_of_copy = gb_per_s / copy_gb_per_s
                  and hbm_fraction is the same against the datasheet HBM bandwidth (None for unknown devices).
                  The attention reads the cache's whole static window [0, P + T) at every step, so the real
                  traffic is a little above `bytes`. The decode starts from a zero cache and random logits:
                  its time does not depend on the values, and no prefill has to be compiled per batch size.

Every timed entry has compile_s (trace + lowering + XLA compile of its first call, from `jax.monitoring`),
first_call_s (that call's wall time), seconds (per call, `repeats` calls dispatched back to back after the
first; 10 for the copy) and recompiles (compilations during the timed calls; 0 expected). A measurement
that raises is recorded as {"error": traceback} and makes the status "error". `dry_run=True` runs all of it
on tiny shapes on whatever device there is (status "dry_run"). Depends only on jax, flax and numpy. Without
a GPU (and without `dry_run`) it reports `not_run: no GPU`.

The helpers `Report`, `CompileWatch`, `timed_calls`, `section_device` and `random_model` serve the learner's
section (`leap_jax.train.gpu_section`) too.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import traceback
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import monitoring
from jax.sharding import SingleDeviceSharding

from leap_jax.models import ModelConfig, Transformer, init_cache
from leap_jax.models import architectures
from leap_jax.sampling.sampler import SamplingParams, _decode, _last_logits

FILE_NAME = "gpu_sampler.json"
SHORT_CALL_REPEATS = 10  # back-to-back calls timed for millisecond kernels (the copy; the learner's matmul)
NO_GPU = "not_run: no GPU"
# HBM bandwidth in bytes/s by device kind (substring of `device_kind`).
PEAK_HBM_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}
# The compile phases `jax.monitoring` reports (top-level jit calls only, so they do not nest).
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")

# Qwen2.5-1.5B's architecture as ModelConfig fields, in bf16 with scanned layers.
QWEN25_1P5B = dataclasses.asdict(ModelConfig.from_hf_config(architectures.QWEN25_1P5B, dtype="bfloat16",
                                                             param_dtype="bfloat16", scan_layers=True))
TINY = dict(
    model_type="qwen2", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=16, max_position_embeddings=256, qkv_bias=True, tie_word_embeddings=True,
    dtype="bfloat16", param_dtype="bfloat16", scan_layers=True)


@dataclasses.dataclass(frozen=True)
class Shapes:
  """What the section measures: ModelConfig fields, copy size, prefill [B, L], decode P + T for R rows."""
  model: dict
  copy_bytes: int
  prefill_batch: int
  prefill_len: int
  prompt_len: int
  new_tokens: int
  decode_batches: tuple[int, ...]
  repeats: int


FULL = Shapes(QWEN25_1P5B, 2 * 2**30, prefill_batch=16, prefill_len=1024, prompt_len=128, new_tokens=256,
              decode_batches=(1, 64), repeats=3)
DRY_RUN = Shapes(TINY, 2**20, prefill_batch=2, prefill_len=16, prompt_len=8, new_tokens=6, decode_batches=(2,),
                 repeats=2)


class Report:
  """A section's JSON document, rewritten to `out_dir/file_name` after every change, and its deadline."""

  def __init__(self, out_dir: str | os.PathLike, file_name: str, deadline: float | None, **fields):
    self.path = os.path.join(out_dir, file_name)
    self.deadline = deadline
    self.data: dict[str, Any] = {}
    os.makedirs(out_dir, exist_ok=True)
    self.update(**fields)

  def update(self, **fields) -> None:
    self.data.update(fields)
    with open(self.path, "w") as f:
      json.dump(self.data, f, indent=2)

  def time_left(self) -> bool:
    return self.deadline is None or time.monotonic() < self.deadline

  def measure(self, key: str, fn: Callable[[], dict]) -> bool:
    """Stores `fn()` under `key`; past the deadline {"skipped": "time budget"}, when it raises {"error": ...}.

    Returns whether `fn` ran to the end.
    """
    if not self.time_left():
      self.update(**{key: {"skipped": "time budget"}})
      return False
    try:
      entry = fn()
    except Exception:  # noqa: BLE001  (keep what was measured; the next measurements may still run)
      error = traceback.format_exc()
      print(error, file=sys.stderr)
      self.update(status="error", **{key: {"error": error[-3000:]}})
      return False
    self.update(**{key: entry})
    print(f"{os.path.basename(self.path)} {key}: {json.dumps(entry)[:500]}")
    return True


class CompileWatch:
  """Counts JAX compilations while active (a `jax.monitoring` duration listener).

    with CompileWatch() as watch: ...
    watch.compiles   backend (XLA) compilations, persistent-cache hits included
    watch.seconds    trace + lowering + backend compile seconds of all of them
  """

  def __init__(self):
    self.compiles = 0
    self.seconds = 0.0

  def _on_event(self, event: str, duration: float, **kwargs) -> None:
    del kwargs
    if event in _COMPILE_EVENTS:
      self.seconds += duration
      self.compiles += event == _COMPILE_EVENTS[-1]

  def __enter__(self) -> "CompileWatch":
    monitoring.register_event_duration_secs_listener(self._on_event)
    return self

  def __exit__(self, *exc) -> None:
    monitoring.unregister_event_duration_listener(self._on_event)


def timed_calls(fn: Callable, args: tuple, repeats: int) -> tuple[dict, Any]:
  """Compiles and runs `fn(*args)` once, then times `repeats` calls dispatched back to back.

  Returns ({"compile_s", "first_call_s", "seconds" (wall seconds per timed call), "recompiles"}, last output).
  """
  with CompileWatch() as first:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first_call = time.perf_counter() - start
  with CompileWatch() as timed:
    start = time.perf_counter()
    for _ in range(repeats):
      out = fn(*args)
    jax.block_until_ready(out)
    seconds = (time.perf_counter() - start) / repeats
  return {"compile_s": round(first.seconds, 3), "first_call_s": round(first_call, 3), "seconds": seconds,
          "recompiles": timed.compiles}, out


def section_device(dry_run: bool):
  """The first GPU; in a dry run without one, the default device; None when there is nothing to measure on."""
  try:
    gpus = jax.devices("gpu")
  except RuntimeError:
    gpus = []
  if gpus:
    return gpus[0]
  return jax.devices()[0] if dry_run else None


def random_model(cfg: ModelConfig, device) -> tuple[nnx.GraphDef, nnx.State]:
  """(graphdef, params) of a randomly initialised Transformer, built in one jitted call, committed to `device`."""
  graphdef = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))[0]
  init = jax.jit(lambda: nnx.state(Transformer(cfg, rngs=nnx.Rngs(0))), out_shardings=SingleDeviceSharding(device))
  return graphdef, init()


def copy_bandwidth(nbytes: int, repeats: int = SHORT_CALL_REPEATS) -> dict:
  """Device copy bandwidth: `jnp.copy` of a uint32[nbytes / 4] array, 2 * nbytes moved per call."""
  x = jnp.arange(nbytes // 4, dtype=jnp.uint32)
  entry, _ = timed_calls(jax.jit(jnp.copy), (x,), repeats)
  moved = 2 * x.nbytes
  return {"bytes": int(x.nbytes), **entry, "gb_per_s": moved / entry["seconds"] / 1e9}


def _prefill_entry(graphdef, cfg: ModelConfig, weights, shapes: Shapes, rng: np.random.Generator) -> dict:
  """Prefill of [B, L] random prompts into a fresh cache of L slots, with the last position's logits."""

  def prefill(weights, tokens):
    model = nnx.merge(graphdef, weights)
    B, L = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
    out = model(tokens, positions, init_cache(cfg, B, L), return_logits=False)
    return out.cache, _last_logits(model, out.final_hidden, jnp.full((B,), L, jnp.int32))

  B, L = shapes.prefill_batch, shapes.prefill_len
  tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (B, L)), jnp.int32)
  entry, _ = timed_calls(jax.jit(prefill), (weights, tokens), shapes.repeats)
  return {"batch": B, "length": L, **entry, "tokens_per_s": B * L / entry["seconds"]}


def decode_bytes(param_bytes: int, kv_bytes: int, rows: int, prompt_len: int, new_tokens: int) -> int:
  """sum_{t=1}^{T-1} (param_bytes + R kv_bytes (P + t)): what the T - 1 decode steps must read."""
  steps = new_tokens - 1
  return steps * param_bytes + rows * kv_bytes * (steps * prompt_len + steps * (steps + 1) // 2)


def _decode_fn(graphdef, shapes: Shapes) -> Callable:
  """jit of (weights, cache, logits[R, V], last[R], keys[R]) -> (tokens[R, T], count[R]), greedy, no stops."""
  P, T = shapes.prompt_len, shapes.new_tokens

  def decode(weights, cache, logits, last, keys):
    R = logits.shape[0]
    _, out, _, count, _ = _decode(nnx.merge(graphdef, weights), cache, logits, jnp.full((R,), P, jnp.int32), last,
                                  keys, jnp.zeros((R,), bool), params=SamplingParams(temperature=0.0),
                                  max_new_tokens=T, stop_ids=(), cache_len=P + T, pad_id=0, attend_len=P + T)
    return out, count

  return jax.jit(decode)


def _decode_entry(decode_fn, cfg: ModelConfig, weights, shapes: Shapes, rows: int, rng: np.random.Generator,
                  copy_gb_per_s: float | None, peak: float | None) -> dict:
  """Times the decode of R rows from a zero cache; bandwidth as in the module docstring."""
  P, T = shapes.prompt_len, shapes.new_tokens
  args = (weights, init_cache(cfg, rows, P + T), jnp.asarray(rng.normal(size=(rows, cfg.vocab_size)), jnp.float32),
          jnp.asarray(rng.integers(0, cfg.vocab_size, rows), jnp.int32), jax.random.split(jax.random.key(0), rows))
  entry, (_, count) = timed_calls(decode_fn, args, shapes.repeats)
  if not bool(jnp.all(count == T)):
    raise RuntimeError(f"decode produced {np.asarray(count).tolist()} tokens, expected {T} per row")
  param_bytes = sum(x.nbytes for x in jax.tree.leaves(weights))
  kv_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * cfg.compute_dtype.itemsize
  nbytes = decode_bytes(param_bytes, kv_bytes, rows, P, T)
  gb_per_s = nbytes / entry["seconds"] / 1e9
  return {"batch": rows, "prompt_len": P, "new_tokens": T, **entry, "tokens_per_s": rows * T / entry["seconds"],
          "step_ms": 1e3 * entry["seconds"] / (T - 1), "bytes": nbytes, "gb_per_s": gb_per_s,
          "fraction_of_copy": gb_per_s / copy_gb_per_s if copy_gb_per_s else None,
          "hbm_fraction": gb_per_s * 1e9 / peak if peak else None}


def _build_model(cfg: ModelConfig, device, model: dict) -> dict:
  """Puts a random model's graphdef and weights in `model`; returns its size and build time."""
  start = time.perf_counter()
  model["graphdef"], model["weights"] = random_model(cfg, device)
  leaves = jax.tree.leaves(model["weights"])
  return {"params": int(sum(x.size for x in leaves)), "param_bytes": int(sum(x.nbytes for x in leaves)),
          "init_s": round(time.perf_counter() - start, 3)}


def _measure(report: Report, device, shapes: Shapes) -> None:
  """The measurements of the module docstring, in order, on `device`."""
  if report.measure("copy", lambda: copy_bandwidth(shapes.copy_bytes)):
    report.update(copy_gb_per_s=report.data["copy"]["gb_per_s"])
  cfg, model = ModelConfig(**shapes.model), {}
  decode_keys = [f"decode_batch_{rows}" for rows in shapes.decode_batches]
  if not report.measure("model", lambda: _build_model(cfg, device, model)):
    reason = report.data["model"].get("skipped", "no model")
    report.update(**{key: {"skipped": reason} for key in ["prefill", *decode_keys]})
    return
  graphdef, weights = model["graphdef"], model["weights"]
  rng = np.random.default_rng(0)
  report.measure("prefill", lambda: _prefill_entry(graphdef, cfg, weights, shapes, rng))
  decode_fn = _decode_fn(graphdef, shapes)
  for key, rows in zip(decode_keys, shapes.decode_batches):
    report.measure(key, lambda rows=rows: _decode_entry(
        decode_fn, cfg, weights, shapes, rows, rng, report.data["copy_gb_per_s"],
        report.data["peak_hbm_bytes_per_s"]))


def run(out_dir: str | os.PathLike, *, deadline: float | None = None, dry_run: bool = False) -> dict:
  """Measures the figures above into `out_dir`/gpu_sampler.json (rewritten after each) and returns them.

  `deadline` is a `time.monotonic()` value; `dry_run` uses tiny shapes on whatever device is present.
  """
  device = section_device(dry_run)
  if device is None:
    print(f"sampler gpu section: {NO_GPU}")
    return Report(out_dir, FILE_NAME, deadline, status=NO_GPU, backend=jax.default_backend()).data
  kind = device.device_kind
  report = Report(out_dir, FILE_NAME, deadline, status="dry_run" if dry_run else "ok", device=kind,
                  jax=jax.__version__, peak_hbm_bytes_per_s=next(
                      (v for k, v in PEAK_HBM_BYTES_PER_S.items() if k in kind), None), copy_gb_per_s=None)
  with jax.default_device(device):
    _measure(report, device, DRY_RUN if dry_run else FULL)
  return report.data


if __name__ == "__main__":
  run(next((a for a in sys.argv[1:] if not a.startswith("--")), "."), dry_run="--dry-run" in sys.argv)
