"""Level 3: multi-channel 1-D convolution."""
import jax
import jax.numpy as jnp
from jax import lax

ID = "conv1d"
LEVEL = 3
SPLIT = "train"
FAMILY = "conv"
STATEMENT = (
    "Multi-channel 1-D convolution (cross-correlation, stride 1, no padding, kernel width 3): out[o, "
    "l] = sum_c sum_{t < 3} w[o, c, t] * x[c, l + t] for 0 <= l < L - 2. x is (CI, L), w is (CO, CI, "
    "3), both float32; out is (CO, L - 2)."
)
DIMS = {
    "check": [{"CI": 12, "CO": 20, "L": 100}, {"CI": 16, "CO": 32, "L": 130}],
    "timing": {"CI": 256, "CO": 256, "L": 16386},
}
INPUTS = [
    {"name": "x", "shape": ["CI", "L"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "w", "shape": ["CO", "CI", 3], "dtype": "float32", "dist": {"kind": "uniform", "low": -0.5, "high": 0.5}},
]


def reference(x, w):
  return lax.conv_general_dilated(x[None], w, (1,), "VALID", precision=lax.Precision.HIGHEST)[0]


SOLUTIONS = {
    "pallas": """
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def kernel(x_ref, w_ref, o_ref, *, ci, co, lo, width, bc):
  bo, bl = o_ref.shape
  outs = pl.program_id(0) * bo + jnp.arange(bo)
  start = pl.program_id(1) * bl
  pos = start + jnp.arange(bl)

  def body(t, acc):
    chans = t * bc + jnp.arange(bc)
    for tap in range(width):
      w = plt.load(w_ref.at[:, pl.ds(t * bc, bc), jnp.int32(tap)],
                   mask=(outs[:, None] < co) & (chans[None, :] < ci), other=0.0)
      x = plt.load(x_ref.at[pl.ds(t * bc, bc), pl.ds(start + tap, bl)],
                   mask=(chans[:, None] < ci) & (pos[None, :] < lo), other=0.0)
      acc = acc + jnp.dot(w, x, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)
    return acc

  acc = jax.lax.fori_loop(0, pl.cdiv(ci, bc), body, jnp.zeros((bo, bl), jnp.float32))
  plt.store(o_ref, acc, mask=(outs[:, None] < co) & (pos[None, :] < lo))


def solution(x, w):
  ci, length = x.shape
  co, _, width = w.shape
  lo = length - width + 1
  bo, bl, bc = 32, 64, 16
  cip = pl.cdiv(ci, bc) * bc
  xw = pl.cdiv(lo, bl) * bl + width - 1
  return pl.pallas_call(
      functools.partial(kernel, ci=ci, co=co, lo=lo, width=width, bc=bc),
      out_shape=jax.ShapeDtypeStruct((co, lo), x.dtype),
      grid=(pl.cdiv(co, bo), pl.cdiv(lo, bl)),
      in_specs=[pl.BlockSpec((cip, xw), lambda i, j: (0, 0)), pl.BlockSpec((bo, cip, width), lambda i, j: (i, 0, 0))],
      out_specs=pl.BlockSpec((bo, bl), lambda i, j: (i, j)),
  )(x, w)
""",
    "cuda": """
#include <cuda_runtime.h>
#include <math.h>

__global__ void conv1d_kernel(const float* x, const float* w, float* out, int CI, int CO, int L) {
  int lo = L - 2;
  int l = blockIdx.x * blockDim.x + threadIdx.x;
  int o = blockIdx.y;
  if (l >= lo) return;
  float acc = 0.0f;
  for (int c = 0; c < CI; ++c) {
    const float* xc = x + (size_t)c * L + l;
    const float* wc = w + ((size_t)o * CI + c) * 3;
    acc += wc[0] * xc[0] + wc[1] * xc[1] + wc[2] * xc[2];
  }
  out[(size_t)o * lo + l] = acc;
}

extern "C" void solution(const float* x, const float* w, float* out, int CI, int CO, int L, cudaStream_t stream) {
  dim3 grid((L - 2 + 255) / 256, CO);
  conv1d_kernel<<<grid, 256, 0, stream>>>(x, w, out, CI, CO, L);
}
""",
}
