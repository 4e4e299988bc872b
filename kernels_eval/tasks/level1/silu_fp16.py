"""Level 1: SiLU in float16."""
import jax
import jax.numpy as jnp

ID = "silu_fp16"
LEVEL = 1
SPLIT = "train"
FAMILY = "elementwise"
STATEMENT = (
    "Apply SiLU elementwise in half precision: out = x * sigmoid(x) = x / (1 + exp(-x)), computed in "
    "float32 and rounded to float16. x is an (M, N) float16 matrix; out has the same shape and dtype."
)
DIMS = {
    "check": [{"M": 100, "N": 300}, {"M": 64, "N": 256}],
    "timing": {"M": 4096, "N": 4096},
}
INPUTS = [
    {"name": "x", "shape": ["M", "N"], "dtype": "float16", "dist": {"kind": "normal"}},
]


def reference(x):
  xf = x.astype(jnp.float32)
  return (xf * jax.nn.sigmoid(xf)).astype(x.dtype)


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
  out = x / (1.0 + jnp.exp(-x))
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
#include <cuda_fp16.h>

__global__ void elementwise_kernel(const __half* x, __half* out, int size) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < size) {
    float v = __half2float(x[i]);
    out[i] = __float2half(v / (1.0f + expf(-v)));
  }
}

extern "C" void solution(const __half* x, __half* out, int M, int N, cudaStream_t stream) {
  int size = M * N;
  elementwise_kernel<<<(size + 255) / 256, 256, 0, stream>>>(x, out, size);
}
""",
}
