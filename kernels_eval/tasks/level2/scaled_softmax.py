"""Level 2: scaled row-wise softmax."""
import jax
import jax.numpy as jnp

ID = "scaled_softmax"
LEVEL = 2
SPLIT = "train"
FAMILY = "softmax"
STATEMENT = (
    "Softmax of scaled scores over each row with scale = 0.125: z = 0.125 * x, out[i, j] = exp(z[i, "
    "j] - max_k z[i, k]) / sum_k exp(z[i, k] - max_k z[i, k]). x is an (M, N) float32 matrix; out has "
    "the same shape."
)
DIMS = {
    "check": [{"M": 50, "N": 300}, {"M": 40, "N": 128}],
    "timing": {"M": 8192, "N": 2048},
}
INPUTS = [
    {"name": "x", "shape": ["M", "N"], "dtype": "float32", "dist": {"kind": "normal"}},
]


def reference(x):
  return jax.nn.softmax(0.125 * x, axis=1)


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
  z = 0.125 * x
  e = jnp.exp(z - jnp.max(z, axis=1, keepdims=True))
  out = e / jnp.sum(e, axis=1, keepdims=True)
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
  float* orow = out + (size_t)blockIdx.x * N;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < N; j += blockDim.x) mx = fmaxf(mx, 0.125f * row[j]);
  mx = block_max(mx, buf);
  float s = 0.0f;
  for (int j = threadIdx.x; j < N; j += blockDim.x) s += expf(0.125f * row[j] - mx);
  s = block_sum(s, buf);
  for (int j = threadIdx.x; j < N; j += blockDim.x) orow[j] = expf(0.125f * row[j] - mx) / s;
}

extern "C" void solution(const float* x, float* out, int M, int N, cudaStream_t stream) {
  row_kernel<<<M, 256, 0, stream>>>(x, out, N);
}
""",
}
