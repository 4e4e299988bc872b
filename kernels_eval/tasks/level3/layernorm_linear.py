"""Level 3: layer normalisation followed by a linear map."""
import jax
import jax.numpy as jnp
from jax import lax

ID = "layernorm_linear"
LEVEL = 3
SPLIT = "train"
FAMILY = "norm"
STATEMENT = (
    "Layer normalisation (eps = 1e-5) followed by a linear map: mu = mean_e x[i, e], var = mean_e "
    "(x[i, e] - mu)^2, y[i, e] = (x[i, e] - mu) / sqrt(var + eps) * gamma[e] + beta[e], out = y @ w. "
    "x is (M, E), gamma and beta are (E,), w is (E, N), all float32; out is (M, N)."
)
DIMS = {
    "check": [{"M": 50, "E": 72, "N": 40}, {"M": 64, "E": 64, "N": 64}],
    "timing": {"M": 4096, "E": 1024, "N": 1024},
}
INPUTS = [
    {"name": "x", "shape": ["M", "E"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "gamma", "shape": ["E"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "beta", "shape": ["E"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "w", "shape": ["E", "N"], "dtype": "float32", "dist": {"kind": "uniform", "low": -0.2, "high": 0.2}},
]


def reference(x, gamma, beta, w):
  mu = jnp.mean(x, axis=1, keepdims=True)
  var = jnp.mean(jnp.square(x - mu), axis=1, keepdims=True)
  y = (x - mu) * lax.rsqrt(var + 1e-5) * gamma + beta
  return jnp.dot(y, w, precision=lax.Precision.HIGHEST)


SOLUTIONS = {
    "pallas": """
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def kernel(x_ref, g_ref, b_ref, w_ref, o_ref, *, m, e, n, bk):
  bm, bn = o_ref.shape
  rows = pl.program_id(0) * bm + jnp.arange(bm)
  cols = pl.program_id(1) * bn + jnp.arange(bn)
  trips = pl.cdiv(e, bk)

  def load_x(t):
    ks = t * bk + jnp.arange(bk)
    mask = (rows[:, None] < m) & (ks[None, :] < e)
    return plt.load(x_ref.at[:, pl.ds(t * bk, bk)], mask=mask, other=0.0), mask

  def sum_body(t, s):
    return s + jnp.sum(load_x(t)[0], axis=1)

  mu = jax.lax.fori_loop(0, trips, sum_body, jnp.zeros((bm,), jnp.float32)) / e

  def var_body(t, s):
    x, mask = load_x(t)
    xc = jnp.where(mask, x - mu[:, None], 0.0)
    return s + jnp.sum(xc * xc, axis=1)

  inv = jax.lax.rsqrt(jax.lax.fori_loop(0, trips, var_body, jnp.zeros((bm,), jnp.float32)) / e + 1e-5)

  def mm_body(t, acc):
    ks = t * bk + jnp.arange(bk)
    x, mask = load_x(t)
    g = plt.load(g_ref.at[pl.ds(t * bk, bk)], mask=ks < e, other=0.0)
    b = plt.load(b_ref.at[pl.ds(t * bk, bk)], mask=ks < e, other=0.0)
    y = jnp.where(mask, (x - mu[:, None]) * inv[:, None] * g[None, :] + b[None, :], 0.0)
    w = plt.load(w_ref.at[pl.ds(t * bk, bk), :], mask=(ks[:, None] < e) & (cols[None, :] < n), other=0.0)
    return acc + jnp.dot(y, w, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)

  acc = jax.lax.fori_loop(0, trips, mm_body, jnp.zeros((bm, bn), jnp.float32))
  plt.store(o_ref, acc, mask=(rows[:, None] < m) & (cols[None, :] < n))


def solution(x, gamma, beta, w):
  m, e = x.shape
  n = w.shape[1]
  bm, bn, bk = 32, 32, 32
  ep = pl.cdiv(e, bk) * bk
  vec_spec = pl.BlockSpec((ep,), lambda i, j: (0,))
  return pl.pallas_call(
      functools.partial(kernel, m=m, e=e, n=n, bk=bk),
      out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
      grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
      in_specs=[
          pl.BlockSpec((bm, ep), lambda i, j: (i, 0)),
          vec_spec,
          vec_spec,
          pl.BlockSpec((ep, bn), lambda i, j: (0, j)),
      ],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
  )(x, gamma, beta, w)
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

__global__ void layernorm_linear_kernel(const float* x, const float* gamma, const float* beta, const float* w, float* out, int E, int N) {
  __shared__ float buf[256];
  const float* xi = x + (size_t)blockIdx.x * E;
  float s = 0.0f;
  for (int e = threadIdx.x; e < E; e += blockDim.x) s += xi[e];
  float mu = block_sum(s, buf) / E;
  float q = 0.0f;
  for (int e = threadIdx.x; e < E; e += blockDim.x) q += (xi[e] - mu) * (xi[e] - mu);
  float inv = rsqrtf(block_sum(q, buf) / E + 1e-5f);
  for (int j = threadIdx.x; j < N; j += blockDim.x) {
    float acc = 0.0f;
    for (int e = 0; e < E; ++e) acc += ((xi[e] - mu) * inv * gamma[e] + beta[e]) * w[(size_t)e * N + j];
    out[(size_t)blockIdx.x * N + j] = acc;
  }
}

extern "C" void solution(const float* x, const float* gamma, const float* beta, const float* w, float* out, int M, int E, int N, cudaStream_t stream) {
  layernorm_linear_kernel<<<M, 256, 0, stream>>>(x, gamma, beta, w, out, E, N);
}
""",
}
