"""nvcc compile time per kernel: cold vs cached, and against torch's `load_inline` where it can build.

  python bench/nvcc.py [--kernels 4] [--nvcc auto|system|pypi]

Cold = nvcc into an empty compile cache (one kernel at a time, then a parallel batch over all cores);
cached = the same sources again (a hit skips nvcc). Where a CUDA build of PyTorch is importable, the
same kernel is also built with `torch.utils.cpp_extension.load_inline` (a fresh build folder each time)
and the ratio load_inline / ours is printed; otherwise that comparison is reported as skipped.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
  sys.path.insert(0, str(REPO_ROOT))

from kernels_eval import task as task_lib  # noqa: E402  (after the path setup above)
from kernels_eval.cuda import compile as compile_lib  # noqa: E402
from kernels_eval.cuda import prototype  # noqa: E402
from kernels_eval.cuda import toolchain  # noqa: E402

TORCH_WRAPPER = """
#include <torch/extension.h>
#include <cuda_runtime.h>
extern "C" void solution(const float* x, const float* y, float* out, int M, int N, cudaStream_t stream);
torch::Tensor run(torch::Tensor x, torch::Tensor y) {
  auto out = torch::empty_like(x);
  solution(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), x.size(0), x.size(1), 0);
  return out;
}
"""


def _sources(n: int) -> tuple[list[str], list[str], list[str]]:
  tasks = [t for t in task_lib.load_tasks() if "cuda" in t.solutions][:n]
  sigs = [prototype.signature_from_task(t) for t in tasks]
  return ([t.id for t in tasks], [t.solutions["cuda"] + s.entry_shim() for t, s in zip(tasks, sigs)],
          [s.prototype() for s in sigs])


def bench_ours(n: int, tc: toolchain.Toolchain, arch: str) -> dict[str, float]:
  ids, sources, protos = _sources(n)
  with tempfile.TemporaryDirectory() as cache:
    cold = []
    for src, proto in zip(sources, protos):
      start = time.perf_counter()
      result = compile_lib.compile_source(src, arch, tc, cache_dir=cache, prototype=proto)
      cold.append(time.perf_counter() - start)
      if not result.ok:
        raise RuntimeError(f"compile failed: {result.feedback}")
    cached = []
    for src, proto in zip(sources, protos):
      start = time.perf_counter()
      assert compile_lib.compile_source(src, arch, tc, cache_dir=cache, prototype=proto).cache_hit
      cached.append(time.perf_counter() - start)
  with tempfile.TemporaryDirectory() as cache:
    start = time.perf_counter()
    compile_lib.compile_many(sources, arch, tc, cache_dir=cache, prototypes=protos)
    batch = time.perf_counter() - start
  print(f"kernels: {', '.join(ids)} ({tc.origin} nvcc {tc.version}, {arch})")
  print(f"ours, cold:   {statistics.median(cold):.2f} s per kernel (median of {len(cold)}; "
        f"min {min(cold):.2f}, max {max(cold):.2f})")
  print(f"ours, cached: {statistics.median(cached) * 1e3:.1f} ms per kernel")
  print(f"ours, cold parallel batch of {len(sources)}: {batch:.2f} s ({batch / len(sources):.2f} s per kernel)")
  return {"cold_s": statistics.median(cold), "cached_s": statistics.median(cached), "batch_s": batch}


def bench_torch(tc: toolchain.Toolchain, ours_cold_s: float) -> None:
  try:
    import torch  # pylint: disable=import-outside-toplevel
    from torch.utils import cpp_extension  # pylint: disable=import-outside-toplevel
  except ImportError:
    print("torch load_inline: skipped (torch is not installed)")
    return
  if torch.version.cuda is None:
    print(f"torch load_inline: skipped (torch {torch.__version__} is a CPU build)")
    return
  task = {t.id: t for t in task_lib.load_tasks()}["add"]
  with tempfile.TemporaryDirectory() as build:
    start = time.perf_counter()
    cpp_extension.load_inline(name="bench_add", cpp_sources=[TORCH_WRAPPER], cuda_sources=[task.solutions["cuda"]],
                              functions=["run"], build_directory=build, verbose=False)
    seconds = time.perf_counter() - start
  print(f"torch load_inline (add): {seconds:.2f} s; ours cold {ours_cold_s:.2f} s; "
        f"ratio load_inline/ours {seconds / ours_cold_s:.2f}x")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--kernels", type=int, default=4)
  parser.add_argument("--nvcc", default=None, choices=toolchain.PREFERENCES)
  args = parser.parse_args()
  tc = toolchain.find_toolchain(args.nvcc)
  ours = bench_ours(args.kernels, tc, toolchain.target_arch())
  bench_torch(tc, ours["cold_s"])


if __name__ == "__main__":
  main()
