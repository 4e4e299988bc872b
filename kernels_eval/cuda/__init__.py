"""The CUDA C++ path of the evaluator.

  static_check  source rules (allow-listed includes; no asm, allocation, streams, threads, syscalls,
                library calls, events or symbol attributes)
  prototype     the task's `extern "C" solution(...)` signature and the harness entry shim
  toolchain     nvcc: a system CUDA toolkit, else the `nvidia-cuda-nvcc` wheel (KERNELS_EVAL_NVCC)
  compile       fixed flags, dynamic CUDA runtime, cross-process compile cache, parallel batches
  audit         imported symbols against an allow-list; no writable globals
  runner.cu     the harness program that loads a candidate library and runs, checks and times it
  session       one harness process per candidate and input shape, driven from Python
  verdict       harness findings (launches, streams, input mutation, determinism), roofline flag
  gpu_job       the worker-side job; backend: the parent side, registered as language "cuda"

GPU hosts: kernels are built with CUDA 13 (nvcc 13.0) and need an NVIDIA driver >= 580; without a usable
driver the harness reports `not_run` with the reason. A host whose driver supports only CUDA 12 should
point `CUDA_HOME` at a CUDA 12 toolkit (a system toolkit is used before the wheel; the runtime soname
then links libcudart.so.12, see `Toolchain.cudart_soname`). The other route for such hosts, not
built in here, is NVRTC from `nvidia-cuda-nvrtc-cu12`: compile the candidate to PTX at run time and let
the CUDA 12 driver JIT it (that bypasses this nvcc/shared-library path and its symbol audit).
"""
