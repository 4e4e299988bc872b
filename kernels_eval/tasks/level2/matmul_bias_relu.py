"""Level 2: matrix product, bias and ReLU."""
import jax
import jax.numpy as jnp
from jax import lax

ID = "matmul_bias_relu"
LEVEL = 2
SPLIT = "train"
FAMILY = "matmul"
STATEMENT = (
    "Linear layer with ReLU: out = max(x @ w + b, 0), i.e. out[i, j] = max(sum_k x[i, k] * w[k, j] + "
    "b[j], 0). x is (M, K), w is (K, N), b is (N,), all float32; out is (M, N)."
)
DIMS = {
    "check": [{"M": 100, "K": 72, "N": 80}, {"M": 64, "K": 128, "N": 128}],
    "timing": {"M": 2048, "K": 2048, "N": 2048},
}
INPUTS = [
    {"name": "x", "shape": ["M", "K"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "w", "shape": ["K", "N"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "b", "shape": ["N"], "dtype": "float32", "dist": {"kind": "normal"}},
]


def reference(x, w, b):
  return jnp.maximum(jnp.dot(x, w, precision=lax.Precision.HIGHEST) + b, 0.0)


SOLUTIONS = {
    "pallas": """
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def kernel(x_ref, w_ref, b_ref, o_ref, *, m, k, n, bk):
  bm, bn = o_ref.shape
  rows = pl.program_id(0) * bm + jnp.arange(bm)
  cols = pl.program_id(1) * bn + jnp.arange(bn)

  def body(t, acc):
    ks = t * bk + jnp.arange(bk)
    x = plt.load(x_ref.at[:, pl.ds(t * bk, bk)], mask=(rows[:, None] < m) & (ks[None, :] < k), other=0.0)
    w = plt.load(w_ref.at[pl.ds(t * bk, bk), :], mask=(ks[:, None] < k) & (cols[None, :] < n), other=0.0)
    return acc + jnp.dot(x, w, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)

  acc = jax.lax.fori_loop(0, pl.cdiv(k, bk), body, jnp.zeros((bm, bn), jnp.float32))
  y = acc + plt.load(b_ref, mask=cols < n, other=0.0).astype(jnp.float32)[None, :]
  out = jnp.maximum(y, 0.0)
  plt.store(o_ref, out.astype(o_ref.dtype), mask=(rows[:, None] < m) & (cols[None, :] < n))


def solution(x, w, b):
  m, k = x.shape
  n = w.shape[1]
  bm, bn, bk = 64, 64, 32
  kp = pl.cdiv(k, bk) * bk
  return pl.pallas_call(
      functools.partial(kernel, m=m, k=k, n=n, bk=bk),
      out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
      grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
      in_specs=[
          pl.BlockSpec((bm, kp), lambda i, j: (i, 0)),
          pl.BlockSpec((kp, bn), lambda i, j: (0, j)),
          pl.BlockSpec((bn,), lambda i, j: (j,)),
      ],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
  )(x, w, b)
""",
    "cuda": """
#include <cuda_runtime.h>
#include <math.h>

#define TILE 16

__global__ void matmul_bias_kernel(const float* x, const float* w, const float* b, float* out, int M, int K, int N) {
  __shared__ float xs[TILE][TILE];
  __shared__ float ws[TILE][TILE];
  int tx = threadIdx.x, ty = threadIdx.y;
  int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
  float acc = 0.0f;
  for (int t = 0; t < K; t += TILE) {
    xs[ty][tx] = (row < M && t + tx < K) ? x[(size_t)row * K + t + tx] : 0.0f;
    ws[ty][tx] = (t + ty < K && col < N) ? w[(size_t)(t + ty) * N + col] : 0.0f;
    __syncthreads();
    for (int k = 0; k < TILE; ++k) acc += xs[ty][k] * ws[k][tx];
    __syncthreads();
  }
  if (row < M && col < N) {
    float y = acc + b[col];
    out[(size_t)row * N + col] = fmaxf(y, 0.0f);
  }
}

extern "C" void solution(const float* x, const float* w, const float* b, float* out, int M, int K, int N, cudaStream_t stream) {
  dim3 block(TILE, TILE);
  dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
  matmul_bias_kernel<<<grid, block, 0, stream>>>(x, w, b, out, M, K, N);
}
""",
}
