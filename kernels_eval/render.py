"""The one rendering of a task that prompts, the probe and the task generator all use.

`render_task(task, lang)` = statement, inputs (shapes, dtypes, check and timing sizes), the reference
implementation, and the exact kernel contract of `lang` (its backend's `contract`).
"""
from __future__ import annotations

from kernels_eval import task as task_lib

CUDA_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16", "int32": "int"}
CUDA_INCLUDES = ("cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h", "math.h", "cmath", "stdint.h", "cfloat",
                 "float.h")
PALLAS_IMPORTS = ("jax", "jax.numpy", "jax.lax", "jax.experimental.pallas",
                  "jax.experimental.pallas.triton", "functools", "math")


def pallas_signature(task: task_lib.Task) -> str:
  return f"def solution({', '.join(task.input_names)}) -> jax.Array"


def cuda_output_dtype(task: task_lib.Task) -> str:
  """The output element type of the CUDA prototype: the dtype of the first input."""
  return task.inputs[0].dtype


def cuda_prototype(task: task_lib.Task) -> str:
  """`extern "C" void solution(const T* <input>..., T* out, int <dim>..., cudaStream_t stream);`

  T is the C type of each input's dtype; `out` has the type of `cuda_output_dtype`; the ints follow the
  order of DIMS["timing"].
  """
  args = [f"const {CUDA_TYPES[i.dtype]}* {i.name}" for i in task.inputs]
  args.append(f"{CUDA_TYPES[cuda_output_dtype(task)]}* out")
  args += [f"int {d}" for d in task.dim_names]
  args.append("cudaStream_t stream")
  return f'extern "C" void solution({", ".join(args)});'


def pallas_contract(task: task_lib.Task) -> str:
  """The Pallas contract. Level 0 shows the whole kernel and asks only for the marked line(s)."""
  imports = (f"Allowed imports: {', '.join(PALLAS_IMPORTS)}. No file, process or network access, no "
             "eval/exec/getattr, no dunder or private attributes, no mutable module-level state or caches.")
  if task.level == 0 and "pallas" in task.skeleton:
    return "\n".join([
        "Complete this JAX Pallas (Triton dialect) kernel: everything but the computation is written.",
        "```python", task.skeleton["pallas"].strip("\n"), "```",
        f"Reply with only the line(s) that replace `{task_lib.SKELETON_MARKER}`, in one ```python code block; "
        "they are inserted at that line's indentation. (A reply holding the whole completed source is "
        f"accepted too.) {imports}",
    ])
  return "\n".join([
      "Write the kernel in JAX Pallas (Triton dialect). Your source must define",
      f"    {pallas_signature(task)}",
      "which returns the same array as `reference` (same shape and dtype), computed by "
      "`pl.pallas_call` (`from jax.experimental import pallas as pl`).",
      "Rules:",
      "- The returned array must be an output of pl.pallas_call, followed at most by reshapes, slices or "
      "casts. Outside the kernel only reshape, slice, pad, broadcast or cast the inputs; every kernel you "
      "launch must contribute to the result.",
      "- Triton dialect: every block shape and every array inside the kernel has power-of-two sizes. The "
      "lowering does not mask partial blocks: over a `pl.cdiv` grid, load and store them with masks "
      "(`from jax.experimental.pallas import triton as plt`; `plt.load(ref, mask=..., other=...)`, "
      "`plt.store(ref, value, mask=...)`). The check sizes above include sizes that are not powers of two.",
      "- Matrix products inside kernels: `jnp.dot(a, b, preferred_element_type=jnp.float32, "
      "precision=jax.lax.Precision.HIGHEST)`.",
      "- Do not pass `interpret=` or `backend=`: the harness runs interpret mode on CPU and the Triton "
      "lowering on GPU (optional: `compiler_params=jax.experimental.pallas.triton.CompilerParams("
      "num_warps=..., num_stages=...)`).",
      f"- {imports}",
      "Answer with the complete source in one ```python code block.",
  ])


def cuda_contract(task: task_lib.Task) -> str:
  return "\n".join([
      "Write the kernel in CUDA C++. Your source must define kernels plus one launch function:",
      f"    {cuda_prototype(task)}",
      "The harness allocates the inputs and `out` on the device, owns `stream`, calls `solution` once "
      "per trial and synchronises. Launch all work on `stream`.",
      f"Allowed includes: {', '.join(CUDA_INCLUDES)}. No other libraries.",
      "Answer with the complete source in one ```cuda code block.",
  ])


def _shape_text(spec: task_lib.InputSpec) -> str:
  return "[" + ", ".join(str(d) for d in spec.shape) + "]"


def render_task(task: task_lib.Task, lang: str) -> str:
  """Statement, inputs, reference and the contract of `lang`."""
  from kernels_eval import backends  # pylint: disable=import-outside-toplevel  (backends import render)
  if task.kernelbench is not None:
    from kernels_eval.kernelbench import render as kernelbench_render  # pylint: disable=import-outside-toplevel
    contract = kernelbench_render.contract(task, lang)
  else:
    try:
      contract = backends.get(lang).contract(task)
    except ValueError:
      if lang != "cuda":
        raise
      contract = cuda_contract(task)
  inputs = "\n".join(f"- {i.name}: shape {_shape_text(i)}, {i.dtype}, values "
                     f"{'as the problem file makes them' if task.kernelbench else i.dist['kind']}"
                     for i in task.inputs)
  checks = "; ".join(", ".join(f"{k}={v}" for k, v in d.items()) for d in task.check_dims)
  timing = ", ".join(f"{k}={v}" for k, v in task.timing_dims.items())
  tol = "; ".join(f"{dt}: atol={task.tolerance_for(dt)['atol']:g}, rtol={task.tolerance_for(dt)['rtol']:g}"
                  for dt in sorted({i.dtype for i in task.inputs}))
  return "\n".join([
      f"# Task {task.id} (level {task.level}, {task.family})",
      "",
      task.statement,
      "",
      "Inputs (in argument order):",
      inputs,
      f"Correctness is checked at sizes: {checks}. Performance is measured at: {timing}.",
      f"Tolerance: {tol}; plus a relative L2 error check.",
      "",
      "Reference implementation:",
      "```python",
      task.reference_source.strip(),
      "```",
      "",
      contract,
  ])
