"""Worker side: runs a KernelBench problem's torch reference (the runner `kernelbench_reference`).

Only ever imported by a worker; torch is imported inside `run`, in the job's sandboxed child, before
`sandbox.lock_down` (torch loads its libraries with ctypes); the problem file is untrusted code and runs
after it. Seeding follows KernelBench's evaluation (seed 42):

    set_seed(42); init = get_init_inputs(); set_seed(42); model = Model(*init)
    set_seed(42); trial_seeds = [randint(0, 2**32 - 1) for each trial]
    per trial t: set_seed(s_t); inputs = get_inputs(); set_seed(s_t); out = model(*inputs)   (no_grad)

so parameters are initialised as KernelBench initialises them. The model stays in training mode as in
KernelBench, except that `nn.Dropout*` layers are put in eval mode (identity). The module's size
constants are replaced by `payload["sizes"]` before any of it runs.

After KernelBench's trials come `extra_trials` of the project's own: every floating input redrawn from
the request's secret seed (normal, mean ~ U(-1, 1), scale log-uniform in [0.5, 2]: `trials.draw`), every
other input from `get_inputs()` under a seed derived from it (class targets, indices, masks keep their
structure). Arrays cross to the parent in JAX's dtypes: int64 as int32 (values must fit), float64 as
float32; the problem frame records the torch dtypes.

Trial inputs over `max_bytes` in all are never sent (at full size on a GPU): the runner reports
too_large{bytes} instead, and the parent evaluates at the check sizes with a flag.

Frames: env, problem{inputs, params, output}, trials{inputs, params}, reference{outputs},
[timing_reference{output, reference_ms, samples}], done  |  env, too_large, done  |  reference_error{feedback}.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import numpy as np

from kernels_eval import sandbox
from kernels_eval import task as task_lib
from kernels_eval import trials as trials_lib

KERNELBENCH_SEED = 42
TIMING_WARMUP, TIMING_CALLS = 3, 20
_INT32 = np.iinfo(np.int32)


def to_numpy(x) -> np.ndarray:
  """A tensor as the array JAX would hold: int64 -> int32 (checked), float64 -> float32."""
  arr = x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
  if arr.dtype == np.int64:
    if arr.size and (arr.min() < _INT32.min or arr.max() > _INT32.max):
      raise ValueError("an int64 tensor has values outside int32, which JAX (x64 off) cannot hold")
    return arr.astype(np.int32)
  return arr.astype(np.float32) if arr.dtype == np.float64 else arr


def _describe(name: str, x) -> dict[str, Any]:
  return {"name": name, "shape": list(x.shape), "dtype": to_numpy(x.reshape(-1)[:0]).dtype.name,
          "torch_dtype": str(x.dtype).replace("torch.", "")}


def load_problem(source: str, sizes: dict[str, int]) -> dict[str, Any]:
  namespace: dict[str, Any] = {"__name__": "kernelbench_problem"}
  exec(compile(source, "problem.py", "exec"), namespace)  # pylint: disable=exec-used
  namespace.update(sizes)
  return namespace


def build_model(torch, namespace: dict[str, Any], device: str, model_cls=None):
  """`model_cls(*get_init_inputs())` (default: the problem's Model; a candidate's ModelNew gets the same
  seeding, so their parameters match) seeded as KernelBench seeds it, dropout layers in eval mode."""
  torch.manual_seed(KERNELBENCH_SEED)
  init = namespace["get_init_inputs"]()
  torch.manual_seed(KERNELBENCH_SEED)
  model = (model_cls or namespace["Model"])(*init).to(device)
  for module in model.modules():
    if type(module).__name__.startswith(("Dropout", "AlphaDropout", "FeatureAlphaDropout")):
      module.eval()
  return model


def _tensors(inputs: list, device: str) -> list:
  if not all(hasattr(x, "detach") for x in inputs):
    raise TypeError("get_inputs() returned a value that is not a tensor (only tensor inputs are supported)")
  return [x.to(device) for x in inputs]


def kernelbench_inputs(torch, namespace: dict[str, Any], n: int, device: str) -> list[tuple[int, list]]:
  """KernelBench's trials: (trial seed, inputs) for each of n trials."""
  torch.manual_seed(KERNELBENCH_SEED)
  seeds = [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(n)]
  out = []
  for s in seeds:
    torch.manual_seed(s)
    out.append((s, _tensors(namespace["get_inputs"](), device)))
  return out


def extra_inputs(torch, namespace: dict[str, Any], n: int, seed: int, device: str) -> list[tuple[int, list]]:
  """The project's trials (see the module docstring): (trial seed, inputs) for each of n trials."""
  out = []
  for e in range(n):
    trial_seed = (seed + 7919 * (e + 1)) % (2**63)
    torch.manual_seed(trial_seed % (2**32))
    base = _tensors(namespace["get_inputs"](), device)
    rng = np.random.default_rng([seed, e])
    inputs = []
    for x in base:
      if x.dtype.is_floating_point:
        spec = task_lib.InputSpec("x", tuple(x.shape), "float32", {"kind": "normal"})
        x = torch.from_numpy(trials_lib.draw(rng, spec, tuple(x.shape))).to(device=device, dtype=x.dtype)
      inputs.append(x)
    out.append((trial_seed % (2**32), inputs))
  return out


def trial_inputs(torch, namespace: dict[str, Any], kb: dict[str, Any], device: str) -> list[tuple[int, list]]:
  """Every trial of a job's payload `kb`: KernelBench's `kb_trials`, then the project's `extra_trials`."""
  return (kernelbench_inputs(torch, namespace, kb["kb_trials"], device)
          + extra_inputs(torch, namespace, kb["extra_trials"], kb["seed"], device))


def time_model(torch, model, inputs: list) -> list[float]:
  """Device times (ms) of TIMING_CALLS calls after TIMING_WARMUP, with CUDA events."""
  for _ in range(TIMING_WARMUP):
    model(*inputs)
  samples = []
  for _ in range(TIMING_CALLS):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    model(*inputs)
    end.record()
    torch.cuda.synchronize()
    samples.append(float(start.elapsed_time(end)))
  return samples


def _reference(torch, kb: dict[str, Any], emit, device: str) -> None:
  namespace = load_problem(kb["source"], kb["sizes"])
  model = build_model(torch, namespace, device)
  params = list(model.named_parameters()) + list(model.named_buffers())
  trials = trial_inputs(torch, namespace, kb, device)
  nbytes = sum(x.numel() * x.element_size() for _, inputs in trials for x in inputs)
  if nbytes > kb["max_bytes"]:
    emit({"kind": "too_large", "bytes": int(nbytes)})
    return
  outputs = []
  with torch.no_grad():
    for s, inputs in trials:
      torch.manual_seed(s)
      outputs.append(model(*inputs))
  if not all(hasattr(o, "detach") for o in outputs):
    raise TypeError("Model.forward must return one tensor")
  emit({"kind": "problem", "inputs": [_describe(n, x) for n, x in zip(kb["forward_args"], trials[0][1])],
        "params": [_describe(n.replace(".", "_"), p) for n, p in params],
        "output": _describe("out", outputs[0])})
  emit({"kind": "trials", "inputs": [[to_numpy(x) for x in inputs] for _, inputs in trials],
        "params": [to_numpy(p) for _, p in params]})
  emit({"kind": "reference", "outputs": [to_numpy(o) for o in outputs]})
  if kb.get("time") and device == "cuda":
    with torch.no_grad():
      samples = time_model(torch, model, trials[0][1])
    emit({"kind": "timing_reference", "output": to_numpy(outputs[0]), "reference_ms": statistics.median(samples),
          "samples": samples})


def run(payload: dict[str, Any], emit: Callable[[dict[str, Any]], None], tmpdir: str) -> None:
  start = time.monotonic()
  import torch  # pylint: disable=import-outside-toplevel  (only in this sandboxed child)
  torch.set_num_threads(1)
  kb = payload["kernelbench"]
  device = "cuda" if kb.get("full_size") and torch.cuda.is_available() else "cpu"
  emit({"kind": "env", "platform": "gpu" if device == "cuda" else "cpu"})
  sandbox.lock_down(tmpdir)
  try:
    _reference(torch, kb, emit, device)
  except Exception as e:  # noqa: BLE001  (any failure of the problem's code is the problem's)
    emit({"kind": "reference_error", "feedback": sandbox.format_exception(e)})
    return
  emit({"kind": "done", "durations": {"reference": time.monotonic() - start}})
