"""Level 3: SwiGLU MLP block."""
import jax
import jax.numpy as jnp
from jax import lax

ID = "mlp_swiglu"
LEVEL = 3
SPLIT = "train"
FAMILY = "mlp"
STATEMENT = (
    "SwiGLU MLP block: h = silu(x @ wg) * (x @ wu) with silu(z) = z / (1 + exp(-z)), out = h @ wd. x "
    "is (M, E), wg and wu are (E, F), wd is (F, E), all float32 (F <= 4096); out is (M, E)."
)
DIMS = {
    "check": [{"M": 40, "E": 48, "F": 80}, {"M": 64, "E": 64, "F": 128}],
    "timing": {"M": 2048, "E": 1024, "F": 2816},
}
INPUTS = [
    {"name": "x", "shape": ["M", "E"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "wg", "shape": ["E", "F"], "dtype": "float32", "dist": {"kind": "uniform", "low": -0.2, "high": 0.2}},
    {"name": "wu", "shape": ["E", "F"], "dtype": "float32", "dist": {"kind": "uniform", "low": -0.2, "high": 0.2}},
    {"name": "wd", "shape": ["F", "E"], "dtype": "float32", "dist": {"kind": "uniform", "low": -0.2, "high": 0.2}},
]


def reference(x, wg, wu, wd):
  hi = lax.Precision.HIGHEST
  h = jax.nn.silu(jnp.dot(x, wg, precision=hi)) * jnp.dot(x, wu, precision=hi)
  return jnp.dot(h, wd, precision=hi)


SOLUTIONS = {
    "pallas": """
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def gate_kernel(x_ref, wg_ref, wu_ref, o_ref, *, m, k, n, bk):
  bm, bn = o_ref.shape
  rows = pl.program_id(0) * bm + jnp.arange(bm)
  cols = pl.program_id(1) * bn + jnp.arange(bn)

  def body(t, carry):
    g, u = carry
    ks = t * bk + jnp.arange(bk)
    w_mask = (ks[:, None] < k) & (cols[None, :] < n)
    x = plt.load(x_ref.at[:, pl.ds(t * bk, bk)], mask=(rows[:, None] < m) & (ks[None, :] < k), other=0.0)
    wg = plt.load(wg_ref.at[pl.ds(t * bk, bk), :], mask=w_mask, other=0.0)
    wu = plt.load(wu_ref.at[pl.ds(t * bk, bk), :], mask=w_mask, other=0.0)
    g = g + jnp.dot(x, wg, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)
    u = u + jnp.dot(x, wu, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)
    return g, u

  zeros = jnp.zeros((bm, bn), jnp.float32)
  g, u = jax.lax.fori_loop(0, pl.cdiv(k, bk), body, (zeros, zeros))
  plt.store(o_ref, g / (1.0 + jnp.exp(-g)) * u, mask=(rows[:, None] < m) & (cols[None, :] < n))


def down_kernel(x_ref, w_ref, o_ref, *, m, k, n, bk):
  bm, bn = o_ref.shape
  rows = pl.program_id(0) * bm + jnp.arange(bm)
  cols = pl.program_id(1) * bn + jnp.arange(bn)
  out_mask = (rows[:, None] < m) & (cols[None, :] < n)

  def body(t, acc):
    ks = t * bk + jnp.arange(bk)
    x = plt.load(x_ref.at[:, pl.ds(t * bk, bk)], mask=(rows[:, None] < m) & (ks[None, :] < k), other=0.0)
    w = plt.load(w_ref.at[pl.ds(t * bk, bk), :], mask=(ks[:, None] < k) & (cols[None, :] < n), other=0.0)
    return acc + jnp.dot(x, w, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)

  y = jax.lax.fori_loop(0, pl.cdiv(k, bk), body, jnp.zeros((bm, bn), jnp.float32))
  out = y
  plt.store(o_ref, out, mask=out_mask)


def solution(x, wg, wu, wd):
  m, e = x.shape
  f = wg.shape[1]
  bm, bn, bk = 32, 32, 32
  ep = pl.cdiv(e, bk) * bk
  w_spec = pl.BlockSpec((ep, bn), lambda i, j: (0, j))
  h = pl.pallas_call(
      functools.partial(gate_kernel, m=m, k=e, n=f, bk=bk),
      out_shape=jax.ShapeDtypeStruct((m, f), x.dtype),
      grid=(pl.cdiv(m, bm), pl.cdiv(f, bn)),
      in_specs=[pl.BlockSpec((bm, ep), lambda i, j: (i, 0)), w_spec, w_spec],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
  )(x, wg, wu)
  fp = pl.cdiv(f, bk) * bk
  return pl.pallas_call(
      functools.partial(down_kernel, m=m, k=f, n=e, bk=bk),
      out_shape=jax.ShapeDtypeStruct((m, e), x.dtype),
      grid=(pl.cdiv(m, bm), pl.cdiv(e, bn)),
      in_specs=[pl.BlockSpec((bm, fp), lambda i, j: (i, 0)), pl.BlockSpec((fp, bn), lambda i, j: (0, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
  )(h, wd)
""",
    "cuda": """
#include <cuda_runtime.h>
#include <math.h>

#define MAX_F 4096

__global__ void swiglu_mlp_kernel(const float* x, const float* wg, const float* wu, const float* wd, float* out, int E, int F) {
  __shared__ float h[MAX_F];
  const float* xi = x + (size_t)blockIdx.x * E;
  for (int f = threadIdx.x; f < F; f += blockDim.x) {
    float g = 0.0f, u = 0.0f;
    for (int e = 0; e < E; ++e) {
      g += xi[e] * wg[(size_t)e * F + f];
      u += xi[e] * wu[(size_t)e * F + f];
    }
    h[f] = g / (1.0f + expf(-g)) * u;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    float acc = 0.0f;
    for (int f = 0; f < F; ++f) acc += h[f] * wd[(size_t)f * E + e];
    out[(size_t)blockIdx.x * E + e] = acc;
  }
}

extern "C" void solution(const float* x, const float* wg, const float* wu, const float* wd, float* out, int M, int E, int F, cudaStream_t stream) {
  swiglu_mlp_kernel<<<M, 256, 0, stream>>>(x, wg, wu, wd, out, E, F);
}
""",
}
