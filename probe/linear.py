"""Probe classifiers on pooled activations: class-balanced logistic regression (linear or one hidden layer)
and ridge regression on the solve rate (a diagnostic only).

Shapes: N tasks, d feature width, H hidden width of the MLP option.

Features are standardised with the training set's statistics, z = (x - mu) / sigma, and the probe is fit by
full-batch Adam on the class-balanced, L2-regularised logistic loss

  L(theta) = sum_i w_{y_i} softplus(-(2 y_i - 1) f_theta(z_i)) / sum_i w_{y_i} + l2 * ||W||^2,
  w_c = N / (2 N_c),

with f_theta(z) = z . w + b (linear) or relu(z W1 + b1) . w2 + b2 (MLP). Biases are not regularised.

The generator's reward reads a probe on a standard scale, r = (f_theta(z) - shift) / scale, with shift and scale
the mean and standard deviation of its logits over the reference generator's valid tasks (`with_reward_scale`), so
that a fixed r_bad for invalid tasks means the same for every probe.
"""
from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax


@flax.struct.dataclass
class ProbeParams:
  """A fitted probe.

  mean, scale: f32[d] standardisation statistics.
  weights: {"w": f32[d], "b": f32[]} (linear) or {"w1": f32[d, H], "b1": f32[H], "w2": f32[H], "b2": f32[]}.
  reward_shift, reward_scale: f32[] reward standardisation (`with_reward_scale`); None until it is set.
  """
  mean: jax.Array
  scale: jax.Array
  weights: dict[str, jax.Array]
  reward_shift: jax.Array | None = None
  reward_scale: jax.Array | None = None

  def to_numpy(self) -> dict[str, np.ndarray]:
    flat = {"mean": self.mean, "scale": self.scale, **{f"weights/{k}": v for k, v in self.weights.items()}}
    if self.reward_scale is not None:
      flat.update(reward_shift=self.reward_shift, reward_scale=self.reward_scale)
    return {k: np.asarray(v) for k, v in flat.items()}

  @classmethod
  def from_numpy(cls, arrays: dict[str, Any]) -> "ProbeParams":
    weights = {k.split("/", 1)[1]: jnp.asarray(v) for k, v in arrays.items() if k.startswith("weights/")}
    reward = {k: jnp.asarray(arrays[k]) for k in ("reward_shift", "reward_scale") if k in arrays}
    return cls(mean=jnp.asarray(arrays["mean"]), scale=jnp.asarray(arrays["scale"]), weights=weights, **reward)


def save_probe(path, params: ProbeParams) -> None:
  np.savez(path, **params.to_numpy())


def load_probe(path) -> ProbeParams:
  with np.load(path) as data:
    return ProbeParams.from_numpy(dict(data))


def _check_features(features, name: str = "features") -> np.ndarray:
  x = np.asarray(features, np.float32)
  if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
    raise ValueError(f"{name} must be a non-empty [N, d] array, got shape {x.shape}")
  if not np.all(np.isfinite(x)):
    raise ValueError(f"{name} contains non-finite values")
  return x


def check_binary_labels(labels, n: int) -> np.ndarray:
  """labels as int32[N] in {0, 1}; raises ValueError when they are not binary or hold a single class."""
  y = np.asarray(labels)
  if y.shape != (n,):
    raise ValueError(f"labels must have shape ({n},) like the features, got {y.shape}")
  if not np.all((y == 0) | (y == 1)):
    raise ValueError(f"labels must be 0/1, got values {sorted(set(np.unique(y).tolist()))[:5]}")
  counts = np.bincount(y.astype(np.int32), minlength=2)
  if counts.min() == 0:
    raise ValueError(f"labels hold a single class ({int(counts[0])} negatives, {int(counts[1])} positives): "
                     "a probe needs both in-band and out-of-band tasks")
  return y.astype(np.int32)


def _standardise(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  mean = x.mean(0)
  scale = x.std(0)
  return mean, np.where(scale > 1e-6, scale, 1.0).astype(np.float32)


def _forward(weights: dict[str, jax.Array], z: jax.Array) -> jax.Array:
  if "w" in weights:
    return z @ weights["w"] + weights["b"]
  h = jax.nn.relu(z @ weights["w1"] + weights["b1"])
  return h @ weights["w2"] + weights["b2"]


def probe_predict(params: ProbeParams, features) -> jax.Array:
  """Probe logits: f32[N, d] -> f32[N]."""
  z = (jnp.asarray(features, jnp.float32) - params.mean) / params.scale
  return _forward(params.weights, z)


def with_reward_scale(params: ProbeParams, reference_logits) -> ProbeParams:
  """Sets the reward scale from raw logits f32[M] of the reference generator's valid tasks (M >= 2):
  shift = mean, scale = standard deviation (at least 1e-6)."""
  ref = np.asarray(reference_logits, np.float64)
  if ref.ndim != 1 or ref.size < 2:
    raise ValueError(f"the reward scale needs logits of at least 2 valid reference tasks, got shape {ref.shape}")
  return params.replace(reward_shift=jnp.float32(ref.mean()), reward_scale=jnp.float32(max(ref.std(), 1e-6)))


def probe_reward_logits(params: ProbeParams, features) -> jax.Array:
  """Reward-scale logits f32[N] = (probe_predict - reward_shift) / reward_scale; raw logits without a scale."""
  logits = probe_predict(params, features)
  if params.reward_scale is None:
    return logits
  return (logits - params.reward_shift) / params.reward_scale


def _init_weights(d: int, hidden: int, key: jax.Array) -> dict[str, jax.Array]:
  if hidden == 0:
    return {"w": jnp.zeros((d,), jnp.float32), "b": jnp.zeros((), jnp.float32)}
  k1, k2 = jax.random.split(key)
  return {"w1": jax.random.normal(k1, (d, hidden)) / np.sqrt(d), "b1": jnp.zeros((hidden,)),
          "w2": jax.random.normal(k2, (hidden,)) / np.sqrt(hidden), "b2": jnp.zeros(())}


@functools.partial(jax.jit, static_argnames=("steps", "learning_rate"))
def _fit(weights, z, y, sample_weight, l2, *, steps: int, learning_rate: float):
  opt = optax.adam(learning_rate)

  def loss_fn(w):
    logits = _forward(w, z)
    nll = jnp.sum(sample_weight * optax.sigmoid_binary_cross_entropy(logits, y)) / jnp.sum(sample_weight)
    penalty = sum(jnp.sum(v ** 2) for k, v in w.items() if k.startswith("w"))
    return nll + l2 * penalty

  def step(carry, _):
    w, state = carry
    loss, grads = jax.value_and_grad(loss_fn)(w)
    updates, state = opt.update(grads, state, w)
    return (optax.apply_updates(w, updates), state), loss

  (weights, _), losses = jax.lax.scan(step, (weights, opt.init(weights)), None, length=steps)
  return weights, losses[-1]


def fit_linear_probe(features, labels, *, l2: float = 1e-2, hidden: int = 0, steps: int = 500,
                     learning_rate: float = 0.05, seed: int = 0) -> ProbeParams:
  """Fits the class-balanced logistic probe of the module docstring.

  Args:
    features: f32[N, d] pooled activations.
    labels: {0, 1}[N], y = 1[task in the frontier band]; both classes must occur.
    l2: L2 weight on the weight matrices (not biases), in standardised-feature units.
    hidden: H > 0 adds one ReLU hidden layer of width H (MLP probe); 0 = linear.
    steps, learning_rate: full-batch Adam schedule.
    seed: initialisation of the MLP.

  Returns:
    ProbeParams for `probe_predict`.
  """
  x = _check_features(features)
  y = check_binary_labels(labels, x.shape[0])
  if l2 < 0 or hidden < 0 or steps < 1:
    raise ValueError(f"need l2 >= 0, hidden >= 0 and steps >= 1, got l2={l2}, hidden={hidden}, steps={steps}")
  mean, scale = _standardise(x)
  z = (x - mean) / scale
  counts = np.bincount(y, minlength=2)
  sample_weight = (len(y) / (2.0 * counts))[y].astype(np.float32)
  weights = _init_weights(x.shape[1], hidden, jax.random.PRNGKey(seed))
  weights, _ = _fit(weights, jnp.asarray(z), jnp.asarray(y, jnp.float32), jnp.asarray(sample_weight),
                    jnp.float32(l2), steps=steps, learning_rate=learning_rate)
  return ProbeParams(mean=jnp.asarray(mean), scale=jnp.asarray(scale), weights=weights)


def fit_ridge(features, targets, *, l2: float = 1.0) -> ProbeParams:
  """Ridge regression of the solve rate s/K on standardised features (closed form), a diagnostic only.

    w = (Z^T Z + l2 I)^{-1} Z^T (t - mean t),  b = mean t.
  """
  x = _check_features(features)
  t = np.asarray(targets, np.float64)
  if t.shape != (x.shape[0],):
    raise ValueError(f"targets must have shape ({x.shape[0]},), got {t.shape}")
  mean, scale = _standardise(x)
  z = ((x - mean) / scale).astype(np.float64)
  w = np.linalg.solve(z.T @ z + l2 * np.eye(z.shape[1]), z.T @ (t - t.mean()))
  return ProbeParams(mean=jnp.asarray(mean), scale=jnp.asarray(scale),
                     weights={"w": jnp.asarray(w, jnp.float32), "b": jnp.asarray(t.mean(), jnp.float32)})
