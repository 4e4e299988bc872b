"""Level 2: bias add and GELU."""
import jax
import jax.numpy as jnp

ID = "bias_gelu"
LEVEL = 2
SPLIT = "train"
FAMILY = "elementwise"
STATEMENT = (
    "Bias add followed by GELU (tanh approximation): y[i, j] = x[i, j] + b[j], out = 0.5 * y * (1 + "
    "tanh(sqrt(2 / pi) * (y + 0.044715 * y^3))). x is (M, N), b is (N,), both float32; out is (M, N)."
)
DIMS = {
    "check": [{"M": 100, "N": 300}, {"M": 64, "N": 256}],
    "timing": {"M": 4096, "N": 4096},
}
INPUTS = [
    {"name": "x", "shape": ["M", "N"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "b", "shape": ["N"], "dtype": "float32", "dist": {"kind": "normal"}},
]


def reference(x, b):
  return jax.nn.gelu(x + b, approximate=True)


SOLUTIONS = {
    "pallas": """
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def kernel(x_ref, b_ref, o_ref, *, m, n):
  bm, bn = o_ref.shape
  rows = pl.program_id(0) * bm + jnp.arange(bm)
  cols = pl.program_id(1) * bn + jnp.arange(bn)
  mask = (rows[:, None] < m) & (cols[None, :] < n)
  y = plt.load(x_ref, mask=mask, other=0.0) + plt.load(b_ref, mask=cols < n, other=0.0)[None, :]
  out = 0.5 * y * (1.0 + jnp.tanh(0.7978845608028654 * (y + 0.044715 * y * y * y)))
  plt.store(o_ref, out, mask=mask)


def solution(x, b):
  m, n = x.shape
  bm, bn = 32, 128
  return pl.pallas_call(
      functools.partial(kernel, m=m, n=n),
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
      in_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j)), pl.BlockSpec((bn,), lambda i, j: (j,))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
  )(x, b)
""",
    "cuda": """
#include <cuda_runtime.h>
#include <math.h>

__global__ void bias_gelu_kernel(const float* x, const float* b, float* out, int size, int N) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < size) {
    float y = x[i] + b[i % N];
    out[i] = 0.5f * y * (1.0f + tanhf(0.7978845608028654f * (y + 0.044715f * y * y * y)));
  }
}

extern "C" void solution(const float* x, const float* b, float* out, int M, int N, cudaStream_t stream) {
  int size = M * N;
  bias_gelu_kernel<<<(size + 255) / 256, 256, 0, stream>>>(x, b, out, size, N);
}
""",
}
