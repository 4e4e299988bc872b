"""Level 1: row-wise maximum."""
import jax
import jax.numpy as jnp

ID = "row_max"
LEVEL = 1
SPLIT = "eval"
FAMILY = "reduction"
STATEMENT = (
    "Maximum of each row: out[i] = max_j x[i, j]. x is an (M, N) float32 matrix; out has shape (M,)."
)
DIMS = {
    "check": [{"M": 50, "N": 300}, {"M": 40, "N": 128}],
    "timing": {"M": 8192, "N": 2048},
}
INPUTS = [
    {"name": "x", "shape": ["M", "N"], "dtype": "float32", "dist": {"kind": "normal"}},
]


def reference(x):
  return jnp.max(x, axis=1)


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
  cols = jnp.arange(bn)
  mask = (rows[:, None] < m) & (cols[None, :] < n)
  x = plt.load(x_ref, mask=mask, other=-jnp.inf)
  out = jnp.max(x, axis=1)
  plt.store(o_ref, out, mask=rows < m)


def solution(x):
  m, n = x.shape
  bn = pl.next_power_of_2(n)
  bm = max(1, min(16, 4096 // bn))
  return pl.pallas_call(
      functools.partial(kernel, m=m, n=n),
      out_shape=jax.ShapeDtypeStruct((m,), x.dtype),
      grid=(pl.cdiv(m, bm),),
      in_specs=[pl.BlockSpec((bm, bn), lambda i: (i, 0))],
      out_specs=pl.BlockSpec((bm,), lambda i: (i,)),
  )(x)
""",
    "cuda": """
#include <cuda_runtime.h>
#include <math.h>

__device__ float block_sum(float v, float* buf) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  float r = buf[0];
  __syncthreads();
  return r;
}

__device__ float block_max(float v, float* buf) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] = fmaxf(buf[threadIdx.x], buf[threadIdx.x + s]);
    __syncthreads();
  }
  float r = buf[0];
  __syncthreads();
  return r;
}

__global__ void row_kernel(const float* x, float* out, int N) {
  __shared__ float buf[256];
  const float* row = x + (size_t)blockIdx.x * N;
  float acc = -INFINITY;
  for (int j = threadIdx.x; j < N; j += blockDim.x) acc = fmaxf(acc, row[j]);
  acc = block_max(acc, buf);
  if (threadIdx.x == 0) out[blockIdx.x] = acc;
}

extern "C" void solution(const float* x, float* out, int M, int N, cudaStream_t stream) {
  row_kernel<<<M, 256, 0, stream>>>(x, out, N);
}
""",
}
