"""Level 1: row-wise inclusive prefix sum."""
import jax
import jax.numpy as jnp

ID = "cumsum_row"
LEVEL = 1
SPLIT = "eval"
FAMILY = "scan"
STATEMENT = (
    "Inclusive prefix sum along each row: out[i, j] = sum_{k <= j} x[i, k]. x is an (M, N) float32 "
    "matrix; out has the same shape."
)
DIMS = {
    "check": [{"M": 50, "N": 300}, {"M": 40, "N": 128}],
    "timing": {"M": 8192, "N": 2048},
}
INPUTS = [
    {"name": "x", "shape": ["M", "N"], "dtype": "float32", "dist": {"kind": "normal"}},
]
TOLERANCE = {"float32": {"atol": 0.001, "rtol": 0.0001}}


def reference(x):
  return jnp.cumsum(x, axis=1)


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
  x = plt.load(x_ref, mask=mask, other=0.0)
  out = jnp.cumsum(x, axis=1)
  plt.store(o_ref, out, mask=mask)


def solution(x):
  m, n = x.shape
  bn = pl.next_power_of_2(n)
  bm = max(1, min(16, 4096 // bn))
  return pl.pallas_call(
      functools.partial(kernel, m=m, n=n),
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(pl.cdiv(m, bm),),
      in_specs=[pl.BlockSpec((bm, bn), lambda i: (i, 0))],
      out_specs=pl.BlockSpec((bm, bn), lambda i: (i, 0)),
  )(x)
""",
    "cuda": """
#include <cuda_runtime.h>
#include <math.h>

__global__ void cumsum_kernel(const float* x, float* out, int N) {
  __shared__ float buf[256];
  const float* row = x + (size_t)blockIdx.x * N;
  float* orow = out + (size_t)blockIdx.x * N;
  float carry = 0.0f;
  for (int base = 0; base < N; base += 256) {
    int j = base + threadIdx.x;
    buf[threadIdx.x] = j < N ? row[j] : 0.0f;
    __syncthreads();
    for (int off = 1; off < 256; off <<= 1) {
      float v = threadIdx.x >= off ? buf[threadIdx.x - off] : 0.0f;
      __syncthreads();
      buf[threadIdx.x] += v;
      __syncthreads();
    }
    if (j < N) orow[j] = carry + buf[threadIdx.x];
    carry += buf[255];
    __syncthreads();
  }
}

extern "C" void solution(const float* x, float* out, int M, int N, cudaStream_t stream) {
  cumsum_kernel<<<M, 256, 0, stream>>>(x, out, N);
}
""",
}
