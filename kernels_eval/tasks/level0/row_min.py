"""Level 0: complete the kernel body of a row-wise min reduction."""
import jax
import jax.numpy as jnp

ID = "row_min"
LEVEL = 0
SPLIT = "eval"
FAMILY = "reduction"
STATEMENT = (
    "Take the minimum of each row: out[i] = min_j x[i, j]. x is an (M, N) float32 matrix; out has "
    "shape (M,). Columns past N in a block are masked by the load."
)
DIMS = {
    "check": [{"M": 50, "N": 300}, {"M": 40, "N": 128}],
    "timing": {"M": 16384, "N": 1024},
}
INPUTS = [
    {"name": "x", "shape": ["M", "N"], "dtype": "float32", "dist": {"kind": "normal"}},
]


def reference(x):
  return jnp.min(x, axis=1)


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
  x = plt.load(x_ref, mask=mask, other=jnp.inf)
  out = jnp.min(x, axis=1)
  plt.store(o_ref, out, mask=rows < m)


def solution(x):
  m, n = x.shape
  bm, bn = 8, pl.next_power_of_2(n)
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

__global__ void row_reduce_kernel(const float* x, float* out, int N) {
  __shared__ float buf[256];
  const float* row = x + (size_t)blockIdx.x * N;
  float acc = INFINITY;
  for (int j = threadIdx.x; j < N; j += blockDim.x) acc = fminf(acc, row[j]);
  buf[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] = fminf(buf[threadIdx.x], buf[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = buf[0];
}

extern "C" void solution(const float* x, float* out, int M, int N, cudaStream_t stream) {
  row_reduce_kernel<<<M, 256, 0, stream>>>(x, out, N);
}
""",
}

SKELETON = {
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
  x = plt.load(x_ref, mask=mask, other=jnp.inf)
  # >>> your code here <<<
  plt.store(o_ref, out, mask=rows < m)


def solution(x):
  m, n = x.shape
  bm, bn = 8, pl.next_power_of_2(n)
  return pl.pallas_call(
      functools.partial(kernel, m=m, n=n),
      out_shape=jax.ShapeDtypeStruct((m,), x.dtype),
      grid=(pl.cdiv(m, bm),),
      in_specs=[pl.BlockSpec((bm, bn), lambda i: (i, 0))],
      out_specs=pl.BlockSpec((bm,), lambda i: (i,)),
  )(x)
""",
}
