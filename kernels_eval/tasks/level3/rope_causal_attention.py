"""Level 3: causal attention head with rotary position embeddings."""
import jax
import jax.numpy as jnp
from jax import lax
import math

ID = "rope_causal_attention"
LEVEL = 3
SPLIT = "eval"
FAMILY = "attention"
STATEMENT = (
    "Causal attention head with rotary position embeddings (half-split convention). With half = D / "
    "2, freq[i] = 10000^(-i / half) and angle[p, i] = p * freq[i] for position p and i < half, "
    "rope(x)[p, i] = x[p, i] * cos(angle[p, i]) - x[p, i + half] * sin(angle[p, i]) and rope(x)[p, i "
    "+ half] = x[p, i + half] * cos(angle[p, i]) + x[p, i] * sin(angle[p, i]). scores = rope(q) @ "
    "rope(k)^T / sqrt(D) with scores[i, j] masked out for j > i, out = softmax(scores) @ v, softmax "
    "over the key axis. q, k and v are (S, D) float32 with D even and D <= 128; out is (S, D)."
)
DIMS = {
    "check": [{"S": 100, "D": 48}, {"S": 64, "D": 64}],
    "timing": {"S": 4096, "D": 128},
}
INPUTS = [
    {"name": "q", "shape": ["S", "D"], "dtype": "float32", "dist": {"kind": "uniform", "low": -1.0, "high": 1.0}},
    {"name": "k", "shape": ["S", "D"], "dtype": "float32", "dist": {"kind": "uniform", "low": -1.0, "high": 1.0}},
    {"name": "v", "shape": ["S", "D"], "dtype": "float32", "dist": {"kind": "normal"}},
]


def reference(q, k, v):
  s, d = q.shape
  half = d // 2
  freq = jnp.exp(-math.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / half)
  angle = jnp.arange(s, dtype=jnp.float32)[:, None] * freq[None, :]
  cos, sin = jnp.cos(angle), jnp.sin(angle)

  def rope(x):
    x1, x2 = x[:, :half], x[:, half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=1)

  scores = jnp.dot(rope(q), rope(k).T, precision=lax.Precision.HIGHEST) / math.sqrt(d)
  causal = jnp.arange(s)[None, :] <= jnp.arange(s)[:, None]
  p = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=1)
  return jnp.dot(p, v, precision=lax.Precision.HIGHEST)


SOLUTIONS = {
    "pallas": """
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def rotate(ref, r0, pos, half, hp, s):
  # Loads both halves of rows r0 .. r0 + len(pos) of `ref` and applies the rotary embedding at positions `pos`.
  i = jnp.arange(hp)
  n = pos.shape[0]
  mask = (pos[:, None] < s) & (i[None, :] < half)
  x1 = plt.load(ref.at[pl.ds(r0, n), pl.ds(0, hp)], mask=mask, other=0.0)
  x2 = plt.load(ref.at[pl.ds(r0, n), pl.ds(half, hp)], mask=mask, other=0.0)
  freq = jnp.exp(-math.log(10000.0) * i.astype(jnp.float32) / half)
  angle = pos.astype(jnp.float32)[:, None] * freq[None, :]
  cos, sin = jnp.cos(angle), jnp.sin(angle)
  return x1 * cos - x2 * sin, x2 * cos + x1 * sin


def kernel(q_ref, k_ref, v_ref, o_ref, *, s, d, bk):
  bq, dp = o_ref.shape
  half, hp = d // 2, dp // 2
  start = pl.program_id(0) * bq
  rows = start + jnp.arange(bq)
  dcols = jnp.arange(dp)
  q1, q2 = rotate(q_ref, 0, rows, half, hp, s)
  scale = 1.0 / math.sqrt(d)

  def body(t, carry):
    acc, m_prev, l_prev = carry
    ks = t * bk + jnp.arange(bk)
    k1, k2 = rotate(k_ref, t * bk, ks, half, hp, s)
    v = plt.load(v_ref.at[pl.ds(t * bk, bk), :], mask=(ks[:, None] < s) & (dcols[None, :] < d), other=0.0)
    scores = jnp.dot(q1, k1.T, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST) * scale
    scores = scores + jnp.dot(q2, k2.T, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST) * scale
    scores = jnp.where((ks[None, :] < s) & (ks[None, :] <= rows[:, None]), scores, -jnp.inf)
    m_new = jnp.maximum(m_prev, jnp.max(scores, axis=1))
    alpha = jnp.exp(m_prev - m_new)
    p = jnp.exp(scores - m_new[:, None])
    l_new = l_prev * alpha + jnp.sum(p, axis=1)
    acc = acc * alpha[:, None] + jnp.dot(p, v, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)
    return acc, m_new, l_new

  init = (jnp.zeros((bq, dp), jnp.float32), jnp.full((bq,), -1e30, jnp.float32), jnp.zeros((bq,), jnp.float32))
  acc, _, l = jax.lax.fori_loop(0, pl.cdiv(jnp.minimum(s, start + bq), bk), body, init)
  plt.store(o_ref, acc / l[:, None], mask=(rows[:, None] < s) & (dcols[None, :] < d))


def solution(q, k, v):
  s, d = q.shape
  bq, bk = 32, 32
  dp = max(32, pl.next_power_of_2(d))
  sp = pl.cdiv(s, bk) * bk
  kv_spec = pl.BlockSpec((sp, dp), lambda i: (0, 0))
  return pl.pallas_call(
      functools.partial(kernel, s=s, d=d, bk=bk),
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      grid=(pl.cdiv(s, bq),),
      in_specs=[pl.BlockSpec((bq, dp), lambda i: (i, 0)), kv_spec, kv_spec],
      out_specs=pl.BlockSpec((bq, dp), lambda i: (i, 0)),
  )(q, k, v)
""",
    "cuda": """
#include <cuda_runtime.h>
#include <math.h>

#define MAX_D 128

__global__ void rope_attention_kernel(const float* q, const float* k, const float* v, float* out, int S, int D) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= S) return;
  int half = D / 2;
  float qr[MAX_D], acc[MAX_D];
  const float* qi = q + (size_t)i * D;
  for (int c = 0; c < half; ++c) {
    float a = i * expf(-logf(10000.0f) * c / half);
    float cs = cosf(a), sn = sinf(a);
    qr[c] = qi[c] * cs - qi[c + half] * sn;
    qr[c + half] = qi[c + half] * cs + qi[c] * sn;
  }
  for (int c = 0; c < D; ++c) acc[c] = 0.0f;
  float scale = 1.0f / sqrtf((float)D);
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j <= i; ++j) {
    const float* kj = k + (size_t)j * D;
    float s = 0.0f;
    for (int c = 0; c < half; ++c) {
      float a = j * expf(-logf(10000.0f) * c / half);
      float cs = cosf(a), sn = sinf(a);
      s += qr[c] * (kj[c] * cs - kj[c + half] * sn) + qr[c + half] * (kj[c + half] * cs + kj[c] * sn);
    }
    s *= scale;
    float m_new = fmaxf(m, s);
    float alpha = expf(m - m_new);
    float p = expf(s - m_new);
    l = l * alpha + p;
    for (int c = 0; c < D; ++c) acc[c] = acc[c] * alpha + p * v[(size_t)j * D + c];
    m = m_new;
  }
  for (int c = 0; c < D; ++c) out[(size_t)i * D + c] = acc[c] / l;
}

extern "C" void solution(const float* q, const float* k, const float* v, float* out, int S, int D, cudaStream_t stream) {
  rope_attention_kernel<<<(S + 127) / 128, 128, 0, stream>>>(q, k, v, out, S, D);
}
""",
}
