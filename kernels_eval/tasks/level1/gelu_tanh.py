"""Level 1: GELU (tanh approximation)."""
import jax
import jax.numpy as jnp

ID = "gelu_tanh"
LEVEL = 1
SPLIT = "train"
FAMILY = "elementwise"
STATEMENT = (
    "Apply GELU with the tanh approximation elementwise: out = 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x "
    "+ 0.044715 * x^3))). x is an (M, N) float32 matrix; out has the same shape."
)
DIMS = {
    "check": [{"M": 100, "N": 300}, {"M": 64, "N": 256}],
    "timing": {"M": 4096, "N": 4096},
}
INPUTS = [
    {"name": "x", "shape": ["M", "N"], "dtype": "float32", "dist": {"kind": "normal"}},
]


def reference(x):
  return jax.nn.gelu(x, approximate=True)


SOLUTIONS = {
    "pallas": """
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def kernel(x_ref, o_ref, *, m, n):
  bm, bn = o_ref.shape
  rows = pl.program_id(0) * bm + jnp.arange(bm)
  cols = pl.program_id(1) * bn + jnp.arange(bn)
  mask = (rows[:, None] < m) & (cols[None, :] < n)
  x = plt.load(x_ref, mask=mask, other=0.0).astype(jnp.float32)
  out = 0.5 * x * (1.0 + jnp.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
  plt.store(o_ref, out.astype(o_ref.dtype), mask=mask)


def solution(x):
  m, n = x.shape
  bm, bn = 32, 128
  spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
  return pl.pallas_call(
      functools.partial(kernel, m=m, n=n),
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
      in_specs=[spec],
      out_specs=spec,
  )(x)
""",
    "cuda": """
#include <cuda_runtime.h>
#include <math.h>

__global__ void elementwise_kernel(const float* x, float* out, int size) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < size) {
    float v = x[i];
    out[i] = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
  }
}

extern "C" void solution(const float* x, float* out, int M, int N, cudaStream_t stream) {
  int size = M * N;
  elementwise_kernel<<<(size + 255) / 256, 256, 0, stream>>>(x, out, size);
}
""",
}
