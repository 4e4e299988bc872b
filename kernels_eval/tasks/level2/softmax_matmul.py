"""Level 2: row softmax followed by a matrix product."""
import jax
import jax.numpy as jnp
from jax import lax

ID = "softmax_matmul"
LEVEL = 2
SPLIT = "train"
FAMILY = "softmax"
STATEMENT = (
    "Row softmax of a score matrix followed by a matrix product: p[i, k] = exp(s[i, k] - max_k s[i, "
    "k]) / sum_k exp(s[i, k] - max_k s[i, k]), out[i, j] = sum_k p[i, k] * v[k, j]. s is (M, K), v is "
    "(K, N), both float32; out is (M, N)."
)
DIMS = {
    "check": [{"M": 50, "K": 100, "N": 40}, {"M": 64, "K": 128, "N": 64}],
    "timing": {"M": 4096, "K": 512, "N": 128},
}
INPUTS = [
    {"name": "s", "shape": ["M", "K"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "v", "shape": ["K", "N"], "dtype": "float32", "dist": {"kind": "normal"}},
]


def reference(s, v):
  return jnp.dot(jax.nn.softmax(s, axis=1), v, precision=lax.Precision.HIGHEST)


SOLUTIONS = {
    "pallas": """
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def kernel(s_ref, v_ref, o_ref, *, m, k, n):
  bm, bn = o_ref.shape
  kp = s_ref.shape[1]
  rows = pl.program_id(0) * bm + jnp.arange(bm)
  cols = pl.program_id(1) * bn + jnp.arange(bn)
  ks = jnp.arange(kp)
  s = plt.load(s_ref, mask=(rows[:, None] < m) & (ks[None, :] < k), other=-jnp.inf)
  v = plt.load(v_ref, mask=(ks[:, None] < k) & (cols[None, :] < n), other=0.0)
  e = jnp.exp(s - jnp.max(s, axis=1, keepdims=True))
  p = e / jnp.sum(e, axis=1, keepdims=True)
  out = jnp.dot(p, v, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)
  plt.store(o_ref, out, mask=(rows[:, None] < m) & (cols[None, :] < n))


def solution(s, v):
  m, k = s.shape
  n = v.shape[1]
  kp = max(16, pl.next_power_of_2(k))
  bm, bn = 16, 64
  return pl.pallas_call(
      functools.partial(kernel, m=m, k=k, n=n),
      out_shape=jax.ShapeDtypeStruct((m, n), s.dtype),
      grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
      in_specs=[pl.BlockSpec((bm, kp), lambda i, j: (i, 0)), pl.BlockSpec((kp, bn), lambda i, j: (0, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
  )(s, v)
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

__global__ void softmax_matmul_kernel(const float* s, const float* v, float* out, int K, int N) {
  __shared__ float buf[256];
  const float* row = s + (size_t)blockIdx.x * K;
  float mx = -INFINITY;
  for (int k = threadIdx.x; k < K; k += blockDim.x) mx = fmaxf(mx, row[k]);
  mx = block_max(mx, buf);
  float z = 0.0f;
  for (int k = threadIdx.x; k < K; k += blockDim.x) z += expf(row[k] - mx);
  z = block_sum(z, buf);
  for (int j = threadIdx.x; j < N; j += blockDim.x) {
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += expf(row[k] - mx) * v[(size_t)k * N + j];
    out[(size_t)blockIdx.x * N + j] = acc / z;
  }
}

extern "C" void solution(const float* s, const float* v, float* out, int M, int K, int N, cudaStream_t stream) {
  softmax_matmul_kernel<<<M, 128, 0, stream>>>(s, v, out, K, N);
}
""",
}
