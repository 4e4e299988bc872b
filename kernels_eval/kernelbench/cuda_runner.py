"""Worker side of KernelBench's CUDA answers: the runner `kernelbench_cuda` (frames as in `backends`).

The answer (a `ModelNew` whose kernels `load_inline` builds) is judged against the outputs of the torch
reference, which the job `jobs.run_reference` computed in another process. In one sandboxed child (the jail
every job gets):
  1. torch must see a CUDA device, else `not_run` (never `correct`); a machine without ninja or a CUDA
     toolkit for torch fails before `stage:compile` (the harness's problem, never the answer's).
  2. stage compile: the answer's parts (`answers.Answer`, read by the parent with `ast`) are built by
     torch's own `load_inline` (ninja, c++ and nvcc against the real torch headers, into the job's /tmp)
     with its last step, the import, left out: nothing of the answer is loaded before `sandbox.lock_down`.
     A failed build is the answer's `compile_error`, with the compiler's messages.
  3. `lock_down`; the problem's inputs are made (`reference.trial_inputs`: KernelBench's trials, then the
     project's, from the reference job's seed, on the device: nothing of trial size crosses a pipe) before
     any answer code runs. Then the built module is imported and the answer's source runs with its
     `load_inline` import removed and `load_inline` bound to the built module (`load_answer`): any other
     build meets the audit hook. An exception there is `compile_error`.
  4. stage correctness: `ModelNew(*get_init_inputs())` seeded as the reference's Model
     (`reference.build_model`, so parameters match), called under no_grad per trial; one `output` each.
  5. stage timing (payload `time`): the reference's method (`reference.time_model`: CUDA events after
     warm-up calls) on trial 0's inputs, the GPU lock held exclusive; `timing_output`, `timing{kernel_ms}`.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import statistics
import sys
import time
from typing import Any, Callable

from kernels_eval import gpu_lock
from kernels_eval import sandbox
from kernels_eval.kernelbench import reference

EXTENSION = "kernelbench_answer"
MIN_MS = 1e-3
FEEDBACK_CHARS = 1500


def build_extension(cpp_extension, answer: dict[str, Any], build_dir: str) -> str:
  """The path of the answer's extension, built by `load_inline` without importing it (step 2). Raises what
  the build raises."""
  os.makedirs(build_dir, exist_ok=True)
  built: list[str] = []
  importer = cpp_extension._import_module_from_library  # pylint: disable=protected-access
  cpp_extension._import_module_from_library = (  # pylint: disable=protected-access
      lambda name, path, _: built.append(os.path.join(path, name + cpp_extension.LIB_EXT)))
  try:
    cpp_extension.load_inline(name=EXTENSION, cpp_sources=answer["cpp_source"], cuda_sources=answer["cuda_source"],
                              functions=list(answer["functions"]), extra_cflags=list(answer["extra_cflags"]),
                              extra_cuda_cflags=list(answer["extra_cuda_cflags"]), build_directory=build_dir,
                              verbose=False)
  finally:
    cpp_extension._import_module_from_library = importer  # pylint: disable=protected-access
  return built[0]


def import_extension(path: str):
  """The built extension module (after `lock_down`)."""
  spec = importlib.util.spec_from_file_location(EXTENSION, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_answer(source: str, extension) -> type:
  """The answer's ModelNew: its source run with the `load_inline` import removed and `load_inline` bound to
  a function returning `extension` (step 3). Raises what the source raises."""
  tree = ast.parse(source)
  tree.body = [node for node in tree.body
               if not (isinstance(node, ast.ImportFrom) and node.module == "torch.utils.cpp_extension")]
  namespace: dict[str, Any] = {"__name__": EXTENSION, "load_inline": lambda **_: extension}
  exec(compile(tree, "answer.py", "exec"), namespace)  # pylint: disable=exec-used
  return namespace["ModelNew"]


def emit_outputs(torch, model, trials: list[tuple[int, list]], emit) -> None:
  """One `output` frame per trial (forward under no_grad, the trial's seed set as for the reference)."""
  with torch.no_grad():
    for t, (seed, inputs) in enumerate(trials):
      torch.manual_seed(seed)
      out = model(*inputs)
      if not hasattr(out, "detach"):
        raise TypeError(f"ModelNew.forward must return one tensor, got {type(out).__name__}")
      emit({"kind": "output", "trial": t, "output": reference.to_numpy(out)})


def emit_timing(torch, model, inputs: list, emit) -> None:
  """`timing_output` (a call after the timed ones) and `timing{kernel_ms: median of the samples}`."""
  with torch.no_grad(), gpu_lock.exclusive():
    samples = reference.time_model(torch, model, inputs)
    out = model(*inputs)
  emit({"kind": "timing_output", "output": reference.to_numpy(out)})
  emit({"kind": "timing", "kernel_ms": max(statistics.median(samples), MIN_MS), "flags": [], "samples": samples})


def _error(emit, stage: str, status: str, e: BaseException) -> None:
  emit({"kind": "error", "stage": stage, "status": status,
        "feedback": sandbox.format_exception(e)[-FEEDBACK_CHARS:]})


def judge(torch, payload: dict[str, Any], load_extension: Callable[[], Any], emit, device: str) -> dict[str, float]:
  """Steps 3 (after `lock_down`) to 5 on `device`, the extension loaded by `load_extension()` once the inputs
  exist; {stage: seconds}, or {} after an error frame."""
  kb, t0 = payload["kernelbench"], time.monotonic()
  namespace = reference.load_problem(kb["source"], kb["sizes"])
  trials = reference.trial_inputs(torch, namespace, kb, device)
  try:
    model_cls = load_answer(payload["source"], load_extension())
  except Exception as e:  # noqa: BLE001  (the answer's own failure)
    _error(emit, "compile", "compile_error", e)
    return {}
  emit({"kind": "stage", "stage": "correctness"})
  try:
    model = reference.build_model(torch, namespace, device, model_cls)
    with gpu_lock.shared():
      emit_outputs(torch, model, trials, emit)
  except Exception as e:  # noqa: BLE001
    _error(emit, "correctness", "runtime_error", e)
    return {}
  durations = {"correctness": time.monotonic() - t0}
  if kb.get("time") and payload["stages"] == "full" and device == "cuda":
    emit({"kind": "stage", "stage": "timing"})
    t0 = time.monotonic()
    try:
      emit_timing(torch, model, trials[0][1], emit)
    except Exception as e:  # noqa: BLE001
      _error(emit, "timing", "runtime_error", e)
      return {}
    durations["timing"] = time.monotonic() - t0
  return durations


def run(payload: dict[str, Any], emit: Callable[[dict[str, Any]], None], tmpdir: str) -> None:
  import torch  # pylint: disable=import-outside-toplevel  (only in this sandboxed child)
  from torch.utils import cpp_extension  # pylint: disable=import-outside-toplevel
  on_gpu = torch.cuda.is_available()
  emit({"kind": "env", "platform": "gpu" if on_gpu else "cpu"})
  if on_gpu:
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])  # venv's ninja
    cpp_extension.verify_ninja_availability()
    if cpp_extension.CUDA_HOME is None:
      raise RuntimeError("torch finds no CUDA toolkit (CUDA_HOME) to build KernelBench answers with")
  emit({"kind": "stage", "stage": "compile"})
  if not on_gpu:
    emit({"kind": "not_run", "feedback": "not_run: no GPU (torch sees no CUDA device in the sandbox). The answer "
          "passed the static checks and compiled with nvcc; correctness was not checked."})
    emit({"kind": "done", "durations": {}})
    return
  t0 = time.monotonic()
  os.environ["MAX_JOBS"] = "1"  # one compiler at a time: the job's memory cap holds the whole build
  try:
    path = build_extension(cpp_extension, payload["answer"], os.path.join(tmpdir, "build"))
  except Exception as e:  # noqa: BLE001  (the compiler's verdict on the answer)
    emit({"kind": "error", "stage": "compile", "status": "compile_error",
          "feedback": f"building the extension failed:\n{str(e)[-FEEDBACK_CHARS:]}"})
    return
  durations = {"compile": time.monotonic() - t0}
  torch.cuda.init()  # torch's own CUDA libraries load before the audit hook, which refuses ctypes
  sandbox.lock_down(tmpdir)
  judged = judge(torch, payload, lambda: import_extension(path), emit, "cuda")
  if judged:
    emit({"kind": "done", "durations": {**durations, **judged}})
