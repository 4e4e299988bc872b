"""Level 2: residual add and RMS normalisation."""
import jax
import jax.numpy as jnp
from jax import lax

ID = "add_rmsnorm"
LEVEL = 2
SPLIT = "train"
FAMILY = "norm"
STATEMENT = (
    "Residual add followed by RMS normalisation, eps = 1e-6: h = x + r, out[i, j] = h[i, j] / "
    "sqrt(mean_k h[i, k]^2 + eps) * w[j]. x and r are (M, N), w is (N,), all float32; out is (M, N)."
)
DIMS = {
    "check": [{"M": 50, "N": 300}, {"M": 40, "N": 128}],
    "timing": {"M": 8192, "N": 2048},
}
INPUTS = [
    {"name": "x", "shape": ["M", "N"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "r", "shape": ["M", "N"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "w", "shape": ["N"], "dtype": "float32", "dist": {"kind": "normal"}},
]


def reference(x, r, w):
  h = x + r
  return h * lax.rsqrt(jnp.mean(jnp.square(h), axis=1, keepdims=True) + 1e-6) * w


SOLUTIONS = {
    "pallas": """
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def kernel(x_ref, r_ref, w_ref, o_ref, *, m, n):
  bm, bn = x_ref.shape
  rows = pl.program_id(0) * bm + jnp.arange(bm)
  cols = jnp.arange(bn)
  mask = (rows[:, None] < m) & (cols[None, :] < n)
  h = plt.load(x_ref, mask=mask, other=0.0) + plt.load(r_ref, mask=mask, other=0.0)
  w = plt.load(w_ref, mask=cols < n, other=0.0)
  ms = jnp.sum(h * h, axis=1, keepdims=True) / n
  plt.store(o_ref, h * jax.lax.rsqrt(ms + 1e-6) * w[None, :], mask=mask)


def solution(x, r, w):
  m, n = x.shape
  bn = pl.next_power_of_2(n)
  bm = max(1, min(16, 4096 // bn))
  spec = pl.BlockSpec((bm, bn), lambda i: (i, 0))
  return pl.pallas_call(
      functools.partial(kernel, m=m, n=n),
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(pl.cdiv(m, bm),),
      in_specs=[spec, spec, pl.BlockSpec((bn,), lambda i: (0,))],
      out_specs=spec,
  )(x, r, w)
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

__global__ void add_rmsnorm_kernel(const float* x, const float* r, const float* w, float* out, int N) {
  __shared__ float buf[256];
  size_t base = (size_t)blockIdx.x * N;
  float q = 0.0f;
  for (int j = threadIdx.x; j < N; j += blockDim.x) {
    float h = x[base + j] + r[base + j];
    q += h * h;
  }
  float inv = rsqrtf(block_sum(q, buf) / N + 1e-6f);
  for (int j = threadIdx.x; j < N; j += blockDim.x) out[base + j] = (x[base + j] + r[base + j]) * inv * w[j];
}

extern "C" void solution(const float* x, const float* r, const float* w, float* out, int M, int N, cudaStream_t stream) {
  add_rmsnorm_kernel<<<M, 256, 0, stream>>>(x, r, w, out, N);
}
""",
}
