"""Level 0: complete the kernel body of an elementwise relu kernel."""
import jax
import jax.numpy as jnp

ID = "relu"
LEVEL = 0
SPLIT = "train"
FAMILY = "elementwise"
STATEMENT = (
    "Apply ReLU elementwise: out[i, j] = max(x[i, j], 0). x is an (M, N) float32 matrix; out has the "
    "same shape."
)
DIMS = {
    "check": [{"M": 100, "N": 300}, {"M": 64, "N": 256}],
    "timing": {"M": 4096, "N": 4096},
}
INPUTS = [
    {"name": "x", "shape": ["M", "N"], "dtype": "float32", "dist": {"kind": "normal"}},
]


def reference(x):
  return jnp.maximum(x, 0.0)


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
  x = plt.load(x_ref, mask=mask, other=0.0)
  out = jnp.maximum(x, 0.0)
  plt.store(o_ref, out, mask=mask)


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
  if (i < size) out[i] = fmaxf(x[i], 0.0f);
}

extern "C" void solution(const float* x, float* out, int M, int N, cudaStream_t stream) {
  int size = M * N;
  elementwise_kernel<<<(size + 255) / 256, 256, 0, stream>>>(x, out, size);
}
""",
}

SKELETON = {
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
  x = plt.load(x_ref, mask=mask, other=0.0)
  # >>> your code here <<<
  plt.store(o_ref, out, mask=mask)


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
}
