"""Level 2: SiLU gate times a second input (SwiGLU)."""
import jax
import jax.numpy as jnp

ID = "silu_mul"
LEVEL = 2
SPLIT = "train"
FAMILY = "elementwise"
STATEMENT = (
    "SwiGLU gate: out[i, j] = silu(a[i, j]) * b[i, j] with silu(z) = z / (1 + exp(-z)). a and b are "
    "(M, N) float32 matrices; out has the same shape."
)
DIMS = {
    "check": [{"M": 100, "N": 300}, {"M": 64, "N": 256}],
    "timing": {"M": 4096, "N": 4096},
}
INPUTS = [
    {"name": "a", "shape": ["M", "N"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "b", "shape": ["M", "N"], "dtype": "float32", "dist": {"kind": "normal"}},
]


def reference(a, b):
  return jax.nn.silu(a) * b


SOLUTIONS = {
    "pallas": """
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def kernel(a_ref, b_ref, o_ref, *, m, n):
  bm, bn = o_ref.shape
  rows = pl.program_id(0) * bm + jnp.arange(bm)
  cols = pl.program_id(1) * bn + jnp.arange(bn)
  mask = (rows[:, None] < m) & (cols[None, :] < n)
  a = plt.load(a_ref, mask=mask, other=0.0)
  b = plt.load(b_ref, mask=mask, other=0.0)
  plt.store(o_ref, a / (1.0 + jnp.exp(-a)) * b, mask=mask)


def solution(a, b):
  m, n = a.shape
  bm, bn = 32, 128
  spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
  return pl.pallas_call(
      functools.partial(kernel, m=m, n=n),
      out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
      grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
      in_specs=[spec, spec],
      out_specs=spec,
  )(a, b)
""",
    "cuda": """
#include <cuda_runtime.h>
#include <math.h>

__global__ void silu_mul_kernel(const float* a, const float* b, float* out, int size) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < size) out[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}

extern "C" void solution(const float* a, const float* b, float* out, int M, int N, cudaStream_t stream) {
  int size = M * N;
  silu_mul_kernel<<<(size + 255) / 256, 256, 0, stream>>>(a, b, out, size);
}
""",
}
