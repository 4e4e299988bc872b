"""Level 1: matrix transpose."""
import jax
import jax.numpy as jnp

ID = "transpose"
LEVEL = 1
SPLIT = "train"
FAMILY = "transpose"
STATEMENT = (
    "Transpose a matrix: out[j, i] = x[i, j]. x is an (M, N) float32 matrix; out is (N, M)."
)
DIMS = {
    "check": [{"M": 100, "N": 60}, {"M": 64, "N": 128}],
    "timing": {"M": 4096, "N": 4096},
}
INPUTS = [
    {"name": "x", "shape": ["M", "N"], "dtype": "float32", "dist": {"kind": "normal"}},
]


def reference(x):
  return x.T


SOLUTIONS = {
    "pallas": """
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def kernel(x_ref, o_ref, *, m, n):
  bm, bn = x_ref.shape
  rows = pl.program_id(0) * bm + jnp.arange(bm)
  cols = pl.program_id(1) * bn + jnp.arange(bn)
  x = plt.load(x_ref, mask=(rows[:, None] < m) & (cols[None, :] < n), other=0.0)
  plt.store(o_ref, x.T, mask=(cols[:, None] < n) & (rows[None, :] < m))


def solution(x):
  m, n = x.shape
  bm, bn = 32, 32
  return pl.pallas_call(
      functools.partial(kernel, m=m, n=n),
      out_shape=jax.ShapeDtypeStruct((n, m), x.dtype),
      grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
      in_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
      out_specs=pl.BlockSpec((bn, bm), lambda i, j: (j, i)),
  )(x)
""",
    "cuda": """
#include <cuda_runtime.h>
#include <math.h>

#define TILE 32

__global__ void transpose_kernel(const float* x, float* out, int M, int N) {
  __shared__ float tile[TILE][TILE + 1];
  int c = blockIdx.x * TILE + threadIdx.x;
  for (int r = blockIdx.y * TILE + threadIdx.y; r < blockIdx.y * TILE + TILE; r += blockDim.y) {
    if (r < M && c < N) tile[r - blockIdx.y * TILE][threadIdx.x] = x[(size_t)r * N + c];
  }
  __syncthreads();
  int oc = blockIdx.y * TILE + threadIdx.x;
  for (int orow = blockIdx.x * TILE + threadIdx.y; orow < blockIdx.x * TILE + TILE; orow += blockDim.y) {
    if (orow < N && oc < M) out[(size_t)orow * M + oc] = tile[threadIdx.x][orow - blockIdx.x * TILE];
  }
}

extern "C" void solution(const float* x, float* out, int M, int N, cudaStream_t stream) {
  dim3 block(TILE, 8);
  dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
  transpose_kernel<<<grid, block, 0, stream>>>(x, out, M, N);
}
""",
}
