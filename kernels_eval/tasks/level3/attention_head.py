"""Level 3: single attention head."""
import jax
import jax.numpy as jnp
from jax import lax
import math

ID = "attention_head"
LEVEL = 3
SPLIT = "train"
FAMILY = "attention"
STATEMENT = (
    "Single attention head: out = softmax(q @ k^T / sqrt(D)) @ v, softmax over the key axis. q, k and "
    "v are (S, D) float32 (D <= 128); out is (S, D)."
)
DIMS = {
    "check": [{"S": 100, "D": 48}, {"S": 64, "D": 64}],
    "timing": {"S": 4096, "D": 64},
}
INPUTS = [
    {"name": "q", "shape": ["S", "D"], "dtype": "float32", "dist": {"kind": "uniform", "low": -1.0, "high": 1.0}},
    {"name": "k", "shape": ["S", "D"], "dtype": "float32", "dist": {"kind": "uniform", "low": -1.0, "high": 1.0}},
    {"name": "v", "shape": ["S", "D"], "dtype": "float32", "dist": {"kind": "normal"}},
]


def reference(q, k, v):
  d = q.shape[-1]
  scores = jnp.einsum("...qd,...kd->...qk", q, k, precision=lax.Precision.HIGHEST) / math.sqrt(d)
  return jnp.einsum("...qk,...kd->...qd", jax.nn.softmax(scores, axis=-1), v, precision=lax.Precision.HIGHEST)


SOLUTIONS = {
    "pallas": """
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def kernel(q_ref, k_ref, v_ref, o_ref, *, s, d, bk):
  bq, dp = q_ref.shape
  rows = pl.program_id(0) * bq + jnp.arange(bq)
  dcols = jnp.arange(dp)
  q = plt.load(q_ref, mask=(rows[:, None] < s) & (dcols[None, :] < d), other=0.0)
  scale = 1.0 / math.sqrt(d)

  def body(t, carry):
    acc, m_prev, l_prev = carry
    ks = t * bk + jnp.arange(bk)
    kv_mask = (ks[:, None] < s) & (dcols[None, :] < d)
    k = plt.load(k_ref.at[pl.ds(t * bk, bk), :], mask=kv_mask, other=0.0)
    v = plt.load(v_ref.at[pl.ds(t * bk, bk), :], mask=kv_mask, other=0.0)
    scores = jnp.dot(q, k.T, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST) * scale
    scores = jnp.where(ks[None, :] < s, scores, -jnp.inf)
    m_new = jnp.maximum(m_prev, jnp.max(scores, axis=1))
    alpha = jnp.exp(m_prev - m_new)
    p = jnp.exp(scores - m_new[:, None])
    l_new = l_prev * alpha + jnp.sum(p, axis=1)
    acc = acc * alpha[:, None] + jnp.dot(p, v, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)
    return acc, m_new, l_new

  init = (jnp.zeros((bq, dp), jnp.float32), jnp.full((bq,), -1e30, jnp.float32), jnp.zeros((bq,), jnp.float32))
  acc, _, l = jax.lax.fori_loop(0, pl.cdiv(s, bk), body, init)
  plt.store(o_ref, acc / l[:, None], mask=(rows[:, None] < s) & (dcols[None, :] < d))


def solution(q, k, v):
  s, d = q.shape
  bq, bk = 32, 32
  dp = max(16, pl.next_power_of_2(d))
  sp = pl.cdiv(s, bk) * bk
  return pl.pallas_call(
      functools.partial(kernel, s=s, d=d, bk=bk),
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      grid=(pl.cdiv(s, bq),),
      in_specs=[
          pl.BlockSpec((bq, dp), lambda i: (i, 0)),
          pl.BlockSpec((sp, dp), lambda i: (0, 0)),
          pl.BlockSpec((sp, dp), lambda i: (0, 0)),
      ],
      out_specs=pl.BlockSpec((bq, dp), lambda i: (i, 0)),
  )(q, k, v)
""",
    "cuda": """
#include <cuda_runtime.h>
#include <math.h>

#define MAX_D 128

__global__ void attention_kernel(const float* q, const float* k, const float* v, float* out, int S, int D, float scale) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= S) return;
  size_t base = 0;
  const float* qi = q + base + (size_t)i * D;
  float acc[MAX_D];
  for (int d = 0; d < D; ++d) acc[d] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j < S; ++j) {
    const float* kj = k + base + (size_t)j * D;
    const float* vj = v + base + (size_t)j * D;
    float s = 0.0f;
    for (int d = 0; d < D; ++d) s += qi[d] * kj[d];
    s *= scale;
    float m_new = fmaxf(m, s);
    float alpha = expf(m - m_new);
    float p = expf(s - m_new);
    l = l * alpha + p;
    for (int d = 0; d < D; ++d) acc[d] = acc[d] * alpha + p * vj[d];
    m = m_new;
  }
  for (int d = 0; d < D; ++d) out[base + (size_t)i * D + d] = acc[d] / l;
}

extern "C" void solution(const float* q, const float* k, const float* v, float* out, int S, int D, cudaStream_t stream) {
  dim3 grid((S + 127) / 128);
  attention_kernel<<<grid, 128, 0, stream>>>(q, k, v, out, S, D, 1.0f / sqrtf((float)D));
}
""",
}
