"""Trial seeds and inputs, made in the parent with numpy only.

The seed of a request is HMAC-SHA256(secret, task hash | request id): reproducible for whoever holds the
evaluator's secret and the request id, unknowable to the candidate. Each trial draws fresh inputs:
`normal` inputs get a mean and a scale drawn per trial (mean ~ U(-1, 1), scale log-uniform in
[0.5, 2]), `positive` inputs are exp(N(0, 0.5)) times a per-trial scale, `uniform` and `randint` use
the task's bounds. Trial t uses check dims entry t mod len(check).
"""
from __future__ import annotations

import hashlib
import hmac
import math

import ml_dtypes
import numpy as np

from kernels_eval import task as task_lib

NUM_TRIALS = 5
NP_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "int32": np.int32}


def derive_seed(secret: bytes, task_hash: str, request_id: str) -> int:
  """seed = first 8 bytes of HMAC-SHA256(secret, f"{task_hash}|{request_id}"), as an int < 2**63."""
  if not isinstance(secret, (bytes, bytearray)) or len(secret) < 16:
    raise ValueError("evaluator secret must be at least 16 bytes")
  digest = hmac.new(bytes(secret), f"{task_hash}|{request_id}".encode(), hashlib.sha256).digest()
  return int.from_bytes(digest[:8], "big") >> 1


def draw(rng: np.random.Generator, spec: task_lib.InputSpec, shape: tuple[int, ...]) -> np.ndarray:
  kind = spec.dist["kind"]
  if kind == "normal":
    mean = rng.uniform(-1.0, 1.0)
    scale = math.exp(rng.uniform(math.log(0.5), math.log(2.0)))
    x = rng.normal(mean, scale, size=shape)
  elif kind == "positive":
    scale = math.exp(rng.uniform(math.log(0.5), math.log(2.0)))
    x = np.exp(rng.normal(0.0, 0.5, size=shape)) * scale
  elif kind == "uniform":
    x = rng.uniform(spec.dist["low"], spec.dist["high"], size=shape)
  else:
    x = rng.integers(int(spec.dist["low"]), int(spec.dist["high"]), size=shape)
  return np.asarray(x).astype(NP_DTYPES[spec.dtype])


def trial_inputs(task: task_lib.Task, seed: int, trial: int,
                 dims: dict[str, int] | None = None) -> list[np.ndarray]:
  """Inputs of one trial, in argument order. `dims` overrides the trial's check dims."""
  dims = dims or task.check_dims[trial % len(task.check_dims)]
  rng = np.random.default_rng([seed, trial])
  return [draw(rng, spec, spec.concrete_shape(dims)) for spec in task.inputs]


def all_trials(task: task_lib.Task, seed: int, num_trials: int = NUM_TRIALS) -> list[list[np.ndarray]]:
  return [trial_inputs(task, seed, t) for t in range(num_trials)]
