"""Level 3: depthwise 2-D convolution."""
import jax
import jax.numpy as jnp
from jax import lax

ID = "depthwise_conv2d"
LEVEL = 3
SPLIT = "eval"
FAMILY = "conv"
STATEMENT = (
    "Depthwise 2-D convolution (cross-correlation, stride 1, no padding, 3x3 kernel per channel): "
    "out[c, i, j] = sum_{a < 3} sum_{b < 3} w[c, a, b] * x[c, i + a, j + b] for 0 <= i < H - 2, 0 <= "
    "j < W - 2. x is (C, H, W), w is (C, 3, 3), both float32; out is (C, H - 2, W - 2)."
)
DIMS = {
    "check": [{"C": 3, "H": 20, "W": 30}, {"C": 4, "H": 18, "W": 66}],
    "timing": {"C": 64, "H": 514, "W": 514},
}
INPUTS = [
    {"name": "x", "shape": ["C", "H", "W"], "dtype": "float32", "dist": {"kind": "normal"}},
    {"name": "w", "shape": ["C", 3, 3], "dtype": "float32", "dist": {"kind": "normal"}},
]


def reference(x, w):
  out = lax.conv_general_dilated(x[None], w[:, None], (1, 1), "VALID", feature_group_count=x.shape[0],
                                 precision=lax.Precision.HIGHEST)
  return out[0]


SOLUTIONS = {
    "pallas": """
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def kernel(x_ref, w_ref, o_ref, *, ho, wo):
  bh, bw = o_ref.shape
  hs = pl.program_id(1) * bh + jnp.arange(bh)
  ws = jnp.arange(bw)
  mask = (hs[:, None] < ho) & (ws[None, :] < wo)
  acc = jnp.zeros((bh, bw), jnp.float32)
  for a in range(3):
    for b in range(3):
      x = plt.load(x_ref.at[pl.ds(pl.program_id(1) * bh + a, bh), pl.ds(b, bw)], mask=mask, other=0.0)
      acc = acc + plt.load(w_ref.at[jnp.int32(a), jnp.int32(b)]) * x
  plt.store(o_ref, acc, mask=mask)


def solution(x, w):
  c, h, wd = x.shape
  ho, wo = h - 2, wd - 2
  bh, bw = 8, pl.next_power_of_2(wo)
  xh = pl.cdiv(ho, bh) * bh + 2
  return pl.pallas_call(
      functools.partial(kernel, ho=ho, wo=wo),
      out_shape=jax.ShapeDtypeStruct((c, ho, wo), x.dtype),
      grid=(c, pl.cdiv(ho, bh)),
      in_specs=[
          pl.BlockSpec((None, xh, bw + 2), lambda ch, i: (ch, 0, 0)),
          pl.BlockSpec((None, 3, 3), lambda ch, i: (ch, 0, 0)),
      ],
      out_specs=pl.BlockSpec((None, bh, bw), lambda ch, i: (ch, i, 0)),
  )(x, w)
""",
    "cuda": """
#include <cuda_runtime.h>
#include <math.h>

__global__ void depthwise_conv2d_kernel(const float* x, const float* w, float* out, int H, int W) {
  int ho = H - 2, wo = W - 2;
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  int i = blockIdx.y;
  int c = blockIdx.z;
  if (j >= wo) return;
  const float* xc = x + (size_t)c * H * W;
  const float* wc = w + (size_t)c * 9;
  float acc = 0.0f;
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) acc += wc[a * 3 + b] * xc[(size_t)(i + a) * W + j + b];
  out[((size_t)c * ho + i) * wo + j] = acc;
}

extern "C" void solution(const float* x, const float* w, float* out, int C, int H, int W, cudaStream_t stream) {
  dim3 grid((W - 2 + 127) / 128, H - 2, C);
  depthwise_conv2d_kernel<<<grid, 128, 0, stream>>>(x, w, out, H, W);
}
""",
}
