"""Level 1: matrix product."""
import jax
import jax.numpy as jnp
from jax import lax

ID = "matmul"
LEVEL = 1
SPLIT = "train"
FAMILY = "matmul"
STATEMENT = (
    "Matrix product: out[i, j] = sum_k a[i, k] * b[k, j]. a is (M, K), b is (K, N), both float32; out "
    "is (M, N)."
)
DIMS = {
    "check": [{"M": 100, "K": 72, "N": 80}, {"M": 64, "K": 128, "N": 128}],
    "timing": {"M": 2048, "K": 2048, "N": 2048},
}
INPUTS = [
    {"name": "a", "shape": ["M", "K"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "b", "shape": ["K", "N"], "dtype": "float32", "dist": {"kind": "normal"}},
]


def reference(a, b):
  return jnp.dot(a, b, precision=lax.Precision.HIGHEST)


SOLUTIONS = {
    "pallas": """
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def kernel(a_ref, b_ref, o_ref, *, m, k, n, bk):
  bm, bn = o_ref.shape
  rows = pl.program_id(0) * bm + jnp.arange(bm)
  cols = pl.program_id(1) * bn + jnp.arange(bn)

  def body(t, acc):
    ks = t * bk + jnp.arange(bk)
    a = plt.load(a_ref.at[:, pl.ds(t * bk, bk)], mask=(rows[:, None] < m) & (ks[None, :] < k), other=0.0)
    b = plt.load(b_ref.at[pl.ds(t * bk, bk), :], mask=(ks[:, None] < k) & (cols[None, :] < n), other=0.0)
    return acc + jnp.dot(a, b, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)

  acc = jax.lax.fori_loop(0, pl.cdiv(k, bk), body, jnp.zeros((bm, bn), jnp.float32))
  plt.store(o_ref, acc.astype(o_ref.dtype), mask=(rows[:, None] < m) & (cols[None, :] < n))


def solution(a, b):
  m, k = a.shape
  n = b.shape[1]
  bm, bn, bk = 64, 64, 32
  kp = pl.cdiv(k, bk) * bk
  return pl.pallas_call(
      functools.partial(kernel, m=m, k=k, n=n, bk=bk),
      out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
      grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
      in_specs=[pl.BlockSpec((bm, kp), lambda i, j: (i, 0)), pl.BlockSpec((kp, bn), lambda i, j: (0, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
  )(a, b)
""",
    "cuda": """
#include <cuda_runtime.h>
#include <math.h>

#define TILE 16

__global__ void matmul_kernel(const float* a, const float* b, float* out, int M, int K, int N) {
  __shared__ float as[TILE][TILE];
  __shared__ float bs[TILE][TILE];
  int tx = threadIdx.x, ty = threadIdx.y;
  int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
  float acc = 0.0f;
  for (int t = 0; t < K; t += TILE) {
    as[ty][tx] = (row < M && t + tx < K) ? a[(size_t)row * K + t + tx] : 0.0f;
    bs[ty][tx] = (t + ty < K && col < N) ? b[(size_t)(t + ty) * N + col] : 0.0f;
    __syncthreads();
    for (int k = 0; k < TILE; ++k) acc += as[ty][k] * bs[k][tx];
    __syncthreads();
  }
  if (row < M && col < N) out[(size_t)row * N + col] = acc;
}

extern "C" void solution(const float* a, const float* b, float* out, int M, int K, int N, cudaStream_t stream) {
  dim3 block(TILE, TILE);
  dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
  matmul_kernel<<<grid, block, 0, stream>>>(a, b, out, M, K, N);
}
""",
}
