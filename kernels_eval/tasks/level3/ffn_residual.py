"""Level 3: feed-forward block with a residual connection."""
import jax
import jax.numpy as jnp
from jax import lax

ID = "ffn_residual"
LEVEL = 3
SPLIT = "train"
FAMILY = "mlp"
STATEMENT = (
    "Feed-forward block with a residual connection: out = x + relu(x @ w1) @ w2. x is (M, E), w1 is "
    "(E, F), w2 is (F, E), all float32 (F <= 4096); out is (M, E)."
)
DIMS = {
    "check": [{"M": 40, "E": 48, "F": 80}, {"M": 64, "E": 64, "F": 128}],
    "timing": {"M": 2048, "E": 1024, "F": 2816},
}
INPUTS = [
    {"name": "x", "shape": ["M", "E"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "w1", "shape": ["E", "F"], "dtype": "float32", "dist": {"kind": "uniform", "low": -0.2, "high": 0.2}},
    {"name": "w2", "shape": ["F", "E"], "dtype": "float32", "dist": {"kind": "uniform", "low": -0.2, "high": 0.2}},
]


def reference(x, w1, w2):
  hi = lax.Precision.HIGHEST
  return x + jnp.dot(jnp.maximum(jnp.dot(x, w1, precision=hi), 0.0), w2, precision=hi)


SOLUTIONS = {
    "pallas": """
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def up_kernel(x_ref, w_ref, o_ref, *, m, k, n, bk):
  bm, bn = o_ref.shape
  rows = pl.program_id(0) * bm + jnp.arange(bm)
  cols = pl.program_id(1) * bn + jnp.arange(bn)
  out_mask = (rows[:, None] < m) & (cols[None, :] < n)

  def body(t, acc):
    ks = t * bk + jnp.arange(bk)
    x = plt.load(x_ref.at[:, pl.ds(t * bk, bk)], mask=(rows[:, None] < m) & (ks[None, :] < k), other=0.0)
    w = plt.load(w_ref.at[pl.ds(t * bk, bk), :], mask=(ks[:, None] < k) & (cols[None, :] < n), other=0.0)
    return acc + jnp.dot(x, w, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)

  y = jax.lax.fori_loop(0, pl.cdiv(k, bk), body, jnp.zeros((bm, bn), jnp.float32))
  out = jnp.maximum(y, 0.0)
  plt.store(o_ref, out, mask=out_mask)


def down_kernel(x_ref, w_ref, r_ref, o_ref, *, m, k, n, bk):
  bm, bn = o_ref.shape
  rows = pl.program_id(0) * bm + jnp.arange(bm)
  cols = pl.program_id(1) * bn + jnp.arange(bn)
  out_mask = (rows[:, None] < m) & (cols[None, :] < n)

  def body(t, acc):
    ks = t * bk + jnp.arange(bk)
    x = plt.load(x_ref.at[:, pl.ds(t * bk, bk)], mask=(rows[:, None] < m) & (ks[None, :] < k), other=0.0)
    w = plt.load(w_ref.at[pl.ds(t * bk, bk), :], mask=(ks[:, None] < k) & (cols[None, :] < n), other=0.0)
    return acc + jnp.dot(x, w, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)

  y = jax.lax.fori_loop(0, pl.cdiv(k, bk), body, jnp.zeros((bm, bn), jnp.float32))
  out = y + plt.load(r_ref, mask=out_mask, other=0.0)
  plt.store(o_ref, out, mask=out_mask)


def linear(kernel, x, w, *extras, extra_kinds=()):
  # out = epilogue(x @ w, extras); each extra is a "bias" (N,) or a "full" (M, N) array.
  m, k = x.shape
  n = w.shape[1]
  bm, bn, bk = 32, 32, 32
  kp = pl.cdiv(k, bk) * bk
  extra_specs = [
      pl.BlockSpec((bn,), lambda i, j: (j,)) if kind == "bias" else pl.BlockSpec((bm, bn), lambda i, j: (i, j))
      for kind in extra_kinds
  ]
  return pl.pallas_call(
      functools.partial(kernel, m=m, k=k, n=n, bk=bk),
      out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
      grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
      in_specs=[pl.BlockSpec((bm, kp), lambda i, j: (i, 0)), pl.BlockSpec((kp, bn), lambda i, j: (0, j))] + extra_specs,
      out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
  )(x, w, *extras)


def solution(x, w1, w2):
  h = linear(up_kernel, x, w1)
  return linear(down_kernel, h, w2, x, extra_kinds=("full",))
""",
    "cuda": """
#include <cuda_runtime.h>
#include <math.h>

#define MAX_F 4096

__global__ void ffn_residual_kernel(const float* x, const float* w1, const float* w2, float* out, int E, int F) {
  __shared__ float h[MAX_F];
  const float* xi = x + (size_t)blockIdx.x * E;
  for (int f = threadIdx.x; f < F; f += blockDim.x) {
    float z = 0.0f;
    for (int e = 0; e < E; ++e) z += xi[e] * w1[(size_t)e * F + f];
    h[f] = fmaxf(z, 0.0f);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    float acc = xi[e];
    for (int f = 0; f < F; ++f) acc += h[f] * w2[(size_t)f * E + e];
    out[(size_t)blockIdx.x * E + e] = acc;
  }
}

extern "C" void solution(const float* x, const float* w1, const float* w2, float* out, int M, int E, int F, cudaStream_t stream) {
  ffn_residual_kernel<<<M, 256, 0, stream>>>(x, w1, w2, out, E, F);
}
""",
}
