"""Level 3: two-layer GELU MLP."""
import jax
import jax.numpy as jnp
from jax import lax

ID = "mlp_gelu"
LEVEL = 3
SPLIT = "eval"
FAMILY = "mlp"
STATEMENT = (
    "Two-layer MLP with GELU (tanh approximation): h = gelu(x @ w1 + b1), out = h @ w2 + b2, where "
    "gelu(z) = 0.5 * z * (1 + tanh(sqrt(2 / pi) * (z + 0.044715 * z^3))). x is (M, E), w1 is (E, F), "
    "b1 is (F,), w2 is (F, E), b2 is (E,), all float32 (F <= 4096); out is (M, E)."
)
DIMS = {
    "check": [{"M": 40, "E": 48, "F": 80}, {"M": 64, "E": 64, "F": 128}],
    "timing": {"M": 2048, "E": 1024, "F": 2816},
}
INPUTS = [
    {"name": "x", "shape": ["M", "E"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "w1", "shape": ["E", "F"], "dtype": "float32", "dist": {"kind": "uniform", "low": -0.2, "high": 0.2}},
    {"name": "b1", "shape": ["F"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "w2", "shape": ["F", "E"], "dtype": "float32", "dist": {"kind": "uniform", "low": -0.2, "high": 0.2}},
    {"name": "b2", "shape": ["E"], "dtype": "float32", "dist": {"kind": "normal"}},
]


def reference(x, w1, b1, w2, b2):
  hi = lax.Precision.HIGHEST
  h = jax.nn.gelu(jnp.dot(x, w1, precision=hi) + b1, approximate=True)
  return jnp.dot(h, w2, precision=hi) + b2


SOLUTIONS = {
    "pallas": """
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def up_kernel(x_ref, w_ref, b_ref, o_ref, *, m, k, n, bk):
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
  z = y + plt.load(b_ref, mask=cols < n, other=0.0)[None, :]
  out = 0.5 * z * (1.0 + jnp.tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)))
  plt.store(o_ref, out, mask=out_mask)


def down_kernel(x_ref, w_ref, b_ref, o_ref, *, m, k, n, bk):
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
  out = y + plt.load(b_ref, mask=cols < n, other=0.0)[None, :]
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


def solution(x, w1, b1, w2, b2):
  h = linear(up_kernel, x, w1, b1, extra_kinds=("bias",))
  return linear(down_kernel, h, w2, b2, extra_kinds=("bias",))
""",
    "cuda": """
#include <cuda_runtime.h>
#include <math.h>

#define MAX_F 4096

__global__ void gelu_mlp_kernel(const float* x, const float* w1, const float* b1, const float* w2, const float* b2, float* out, int E, int F) {
  __shared__ float h[MAX_F];
  const float* xi = x + (size_t)blockIdx.x * E;
  for (int f = threadIdx.x; f < F; f += blockDim.x) {
    float z = b1[f];
    for (int e = 0; e < E; ++e) z += xi[e] * w1[(size_t)e * F + f];
    h[f] = 0.5f * z * (1.0f + tanhf(0.7978845608028654f * (z + 0.044715f * z * z * z)));
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    float acc = b2[e];
    for (int f = 0; f < F; ++f) acc += h[f] * w2[(size_t)f * E + e];
    out[(size_t)blockIdx.x * E + e] = acc;
  }
}

extern "C" void solution(const float* x, const float* w1, const float* b1, const float* w2, const float* b2, float* out, int M, int E, int F, cudaStream_t stream) {
  gelu_mlp_kernel<<<M, 256, 0, stream>>>(x, w1, b1, w2, b2, out, E, F);
}
""",
}
