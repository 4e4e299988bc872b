"""Level 2: layer normalisation and ReLU."""
import jax
import jax.numpy as jnp
from jax import lax

ID = "layernorm_relu"
LEVEL = 2
SPLIT = "train"
FAMILY = "norm"
STATEMENT = (
    "Layer normalisation followed by ReLU, eps = 1e-5: mu = mean_j x[i, j], var = mean_j (x[i, j] - "
    "mu)^2, out[i, j] = max((x[i, j] - mu) / sqrt(var + eps) * gamma[j] + beta[j], 0). x is (M, N), "
    "gamma and beta are (N,), all float32; out is (M, N)."
)
DIMS = {
    "check": [{"M": 50, "N": 300}, {"M": 40, "N": 128}],
    "timing": {"M": 8192, "N": 2048},
}
INPUTS = [
    {"name": "x", "shape": ["M", "N"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "gamma", "shape": ["N"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "beta", "shape": ["N"], "dtype": "float32", "dist": {"kind": "normal"}},
]


def reference(x, gamma, beta):
  mu = jnp.mean(x, axis=1, keepdims=True)
  var = jnp.mean(jnp.square(x - mu), axis=1, keepdims=True)
  return jnp.maximum((x - mu) * lax.rsqrt(var + 1e-5) * gamma + beta, 0.0)


SOLUTIONS = {
    "pallas": """
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def kernel(x_ref, gamma_ref, beta_ref, o_ref, *, m, n):
  bm, bn = x_ref.shape
  rows = pl.program_id(0) * bm + jnp.arange(bm)
  cols = jnp.arange(bn)
  mask = (rows[:, None] < m) & (cols[None, :] < n)
  x = plt.load(x_ref, mask=mask, other=0.0)
  gamma = plt.load(gamma_ref, mask=cols < n, other=0.0)
  beta = plt.load(beta_ref, mask=cols < n, other=0.0)
  mu = jnp.sum(x, axis=1, keepdims=True) / n
  xc = jnp.where(mask, x - mu, 0.0)
  var = jnp.sum(xc * xc, axis=1, keepdims=True) / n
  out = jnp.maximum(xc * jax.lax.rsqrt(var + 1e-5) * gamma[None, :] + beta[None, :], 0.0)
  plt.store(o_ref, out, mask=mask)


def solution(x, gamma, beta):
  m, n = x.shape
  bn = pl.next_power_of_2(n)
  bm = max(1, min(16, 4096 // bn))
  return pl.pallas_call(
      functools.partial(kernel, m=m, n=n),
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(pl.cdiv(m, bm),),
      in_specs=[pl.BlockSpec((bm, bn), lambda i: (i, 0))] + [pl.BlockSpec((bn,), lambda i: (0,))] * 2,
      out_specs=pl.BlockSpec((bm, bn), lambda i: (i, 0)),
  )(x, gamma, beta)
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

__global__ void row_kernel(const float* x, const float* gamma, const float* beta, float* out, int N) {
  __shared__ float buf[256];
  const float* row = x + (size_t)blockIdx.x * N;
  float* orow = out + (size_t)blockIdx.x * N;
  float s = 0.0f;
  for (int j = threadIdx.x; j < N; j += blockDim.x) s += row[j];
  float mu = block_sum(s, buf) / N;
  float q = 0.0f;
  for (int j = threadIdx.x; j < N; j += blockDim.x) q += (row[j] - mu) * (row[j] - mu);
  float inv = rsqrtf(block_sum(q, buf) / N + 1e-5f);
  for (int j = threadIdx.x; j < N; j += blockDim.x) orow[j] = fmaxf((row[j] - mu) * inv * gamma[j] + beta[j], 0.0f);
}

extern "C" void solution(const float* x, const float* gamma, const float* beta, float* out, int M, int N, cudaStream_t stream) {
  row_kernel<<<M, 256, 0, stream>>>(x, gamma, beta, out, N);
}
""",
}
