"""The kernel contracts of a KernelBench task, shown by `kernels_eval.render.render_task`."""
from __future__ import annotations

from kernels_eval import render as render_lib
from kernels_eval import task as task_lib


def _arrays(described: list[dict]) -> str:
  return "\n".join(f"- {d['name']}: shape {d['shape']}, {d['dtype']}"
                   + (f" (torch {d['torch_dtype']})" if d["torch_dtype"] != d["dtype"] else "") for d in described)


def pallas_contract(task: task_lib.Task) -> str:
  kb = task.kernelbench
  args = ", ".join(task.input_names)
  out = kb["output"]
  return "\n".join([
      "Write the computation of `Model.forward` as a JAX Pallas (Triton dialect) kernel. Your source must define",
      f"    def solution({args}) -> jax.Array",
      "taking the forward inputs, then the model's parameters and buffers in `named_parameters()` then "
      "`named_buffers()` order ('.' in a name becomes '_'), as the model holds them after its seeded "
      "initialisation. At the check sizes:",
      _arrays(kb["inputs"] + kb["params"]),
      f"It returns shape {out['shape']}, {out['dtype']}" + (f" (torch {out['torch_dtype']}; JAX holds int64 as "
                                                             "int32)" if out["torch_dtype"] != out["dtype"] else "")
      + ". Sizes may differ between trials and at full size; read them from the arguments.",
      render_lib.pallas_contract(task).split("\n", 3)[3],
  ])


def cuda_contract(task: task_lib.Task) -> str:
  del task
  return "\n".join([
      "Write CUDA kernels in KernelBench's answer format: a Python file that builds them with "
      "`torch.utils.cpp_extension.load_inline(name=..., cpp_sources=..., cuda_sources=..., functions=[...])` "
      "and defines `class ModelNew(nn.Module)` with the same constructor arguments and forward as `Model`, "
      "calling your kernels.",
      "Top level: `import torch`, `import torch.nn as nn`, `import torch.nn.functional as F`, `from "
      "torch.utils.cpp_extension import load_inline`, `import math`, string constants, the load_inline call "
      "and ModelNew. CUDA includes: cuda_runtime.h, cuda_fp16.h, cuda_bf16.h, math.h, torch/extension.h, "
      "ATen/cuda/CUDAContext.h; from torch only tensor shapes, data pointers, options and "
      "empty/zeros(_like) (no library ops).",
      "Answer with the complete source in one ```python code block.",
  ])


def contract(task: task_lib.Task, lang: str) -> str:
  return pallas_contract(task) if lang == "pallas" else cuda_contract(task)
