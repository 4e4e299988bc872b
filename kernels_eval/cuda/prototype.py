"""The CUDA launch-function contract of a task, and the harness entry appended to candidate source.

For a task with inputs `x: float32[n]`, `w: float16[n, k]` and DIMS order `(n, k)` the candidate writes

  extern "C" void solution(const float* x, const __half* w, float* out, int n, int k, cudaStream_t stream);

and the harness appends `kernels_eval_call(void* const* buffers, const int* dims, cudaStream_t)` that
calls it with typed arguments (`buffers` = inputs in order, then the output). A candidate whose
`solution` has another signature fails to compile at that call, with a message naming the prototype.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

C_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16", "int32": "int"}
ENTRY_SYMBOL = "kernels_eval_call"
SHIM_FILENAME = "kernels_eval_harness"


@dataclasses.dataclass(frozen=True)
class CudaSignature:
  """input_names/input_dtypes: in argument order; dim_names: in DIMS `timing` key order."""
  input_names: tuple[str, ...]
  input_dtypes: tuple[str, ...]
  output_dtype: str
  dim_names: tuple[str, ...]

  def __post_init__(self):
    for dtype in (*self.input_dtypes, self.output_dtype):
      if dtype not in C_TYPES:
        raise ValueError(f"dtype {dtype!r} has no CUDA type; supported: {sorted(C_TYPES)}")
    if len(self.input_names) != len(self.input_dtypes):
      raise ValueError("CudaSignature: input_names and input_dtypes differ in length")

  def prototype(self) -> str:
    args = [f"const {C_TYPES[d]}* {n}" for n, d in zip(self.input_names, self.input_dtypes)]
    args.append(f"{C_TYPES[self.output_dtype]}* out")
    args += [f"int {d}" for d in self.dim_names]
    args.append("cudaStream_t stream")
    return f'extern "C" void solution({", ".join(args)});'

  def entry_shim(self) -> str:
    """C++ appended after the candidate's last line; `#line` makes its errors name the harness."""
    casts = [f"(const {C_TYPES[d]}*)buffers[{i}]" for i, d in enumerate(self.input_dtypes)]
    casts.append(f"({C_TYPES[self.output_dtype]}*)buffers[{len(self.input_dtypes)}]")
    casts += [f"dims[{i}]" for i in range(len(self.dim_names))]
    casts.append("stream")
    return (f'\n#line 1 "{SHIM_FILENAME}"\n#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n'
            f'extern "C" void {ENTRY_SYMBOL}(void* const* buffers, const int* dims, cudaStream_t stream) {{\n'
            f'  solution({", ".join(casts)});\n}}\n')


def _get(task: Any, key: str) -> Any:
  if isinstance(task, Mapping):
    for k in (key.upper(), key):
      if k in task:
        return task[k]
  elif hasattr(task, key):
    return getattr(task, key)
  raise ValueError(f"task has no {key.upper()!r} field")


def _field(spec: Any, name: str) -> Any:
  return spec[name] if isinstance(spec, Mapping) else getattr(spec, name)


def signature_from_task(task: Any, output_dtype: str | None = None) -> CudaSignature:
  """Builds the signature of a `kernels_eval.task.Task` (or a mapping with the FORMAT.md names).

  The output dtype defaults to the dtype of the first input (as `render.cuda_output_dtype`).
  """
  inputs = _get(task, "inputs")
  dims = _get(task, "dims")
  if not inputs:
    raise ValueError("task has no INPUTS")
  dtypes = tuple(_field(i, "dtype") for i in inputs)
  output_dtype = output_dtype or dtypes[0]
  return CudaSignature(tuple(_field(i, "name") for i in inputs), dtypes, output_dtype, tuple(dims["timing"]))
