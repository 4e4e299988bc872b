"""The CUDA C++ backend of the evaluator (`kernels_eval.backends`), parent side: no JAX.

`static_check(task, source)` runs in the parent for every request:
  1. the source rules of `cuda.static_check` on the source as written (includes, directives, asm,
     allocation, streams, syscalls, attributes, ...);
  2. nvcc -E, host and device pass, jailed (`cuda.compile.preprocess`), and the same rules on the
     candidate's code as the compiler sees it (`check_preprocessed`): macros, digraphs and `#if`
     resolved, includes resolved; a preprocessor that fails, times out or explodes rejects;
  3. nvcc, jailed, through the compile cache (`cuda.compile`; the parent is the only writer of the cache);
  4. the symbol audit of the library (`cuda.audit`), with the `__constant__` names of the preprocessed
     host text.
A compile error is not a rejection: the worker finds the failed build in the cache and reports it as
`compile_error` at stage `compile` with the trimmed nvcc messages. On a GPU host the harness program
(`runner.cu`) is built into the cache here too, once per process. The worker side is
`kernels_eval.cuda.gpu_job:run`, which reads the library from the cache and, on a GPU host, runs it
in the harness program; without a GPU the verdict is `not_run`.

The cache folder (`KERNELS_EVAL_CACHE_DIR`) and nvidia-smi's answer (`toolchain.GPU_ARCHS_ENV`) are
pinned in the environment when this module is imported, so that worker processes started afterwards read
the same cache, compile for the same architecture and never run nvidia-smi themselves.
"""
from __future__ import annotations

import functools
import os
from typing import Sequence

from kernels_eval import backends
from kernels_eval import jail
from kernels_eval import pool as pool_lib
from kernels_eval import render
from kernels_eval import static_check as static_check_lib
from kernels_eval import task as task_lib
from kernels_eval.cuda import audit as audit_lib
from kernels_eval.cuda import compile as compile_lib
from kernels_eval.cuda import prototype as prototype_lib
from kernels_eval.cuda import static_check as cuda_static_check
from kernels_eval.cuda import toolchain as toolchain_lib

os.environ.setdefault(compile_lib.CACHE_ENV, str(compile_lib.default_cache_dir().parent))
toolchain_lib.visible_gpu_arch()


def shimmed_source(task: task_lib.Task, source: str) -> tuple[str, str]:
  """(source + harness entry shim, prototype text) exactly as compiled by parent and worker."""
  sig = prototype_lib.signature_from_task(task)
  return source + sig.entry_shim(), sig.prototype()


def build(task: task_lib.Task, source: str) -> compile_lib.CompileResult:
  """Compiles the candidate (cached) for the target architecture."""
  full, proto = shimmed_source(task, source)
  return compile_lib.compile_source(full, toolchain_lib.target_arch(), toolchain_lib.find_toolchain(),
                                    prototype=proto)


def build_many(tasks: Sequence[task_lib.Task], sources: Sequence[str]) -> list[compile_lib.CompileResult]:
  """Compiles many candidates in parallel (up to the core count), filling the cache."""
  pairs = [shimmed_source(t, s) for t, s in zip(tasks, sources)]
  return compile_lib.compile_many([p[0] for p in pairs], toolchain_lib.target_arch(),
                                  toolchain_lib.find_toolchain(), prototypes=[p[1] for p in pairs])


@functools.lru_cache(maxsize=1)
def runner_program() -> str:
  """The harness program, built into the cache once, for the workers of a GPU host to read."""
  return compile_lib.build_runner(toolchain_lib.find_toolchain())


def _check(task: task_lib.Task, source: str, tc: toolchain_lib.Toolchain,
           arch: str) -> static_check_lib.Rejection | None:
  """Steps 1-4 of the module docstring; the first rejection wins."""
  rejection = cuda_static_check.check_source(source)
  if rejection is not None:
    return rejection
  pre = compile_lib.preprocess(shimmed_source(task, source)[0], tc, arch)
  if pre.reason is not None:
    return static_check_lib.Rejection(pre.reason, pre.feedback)
  for text in (pre.host, pre.device):
    rejection = cuda_static_check.check_preprocessed(text, tc.root, pre.log)
    if rejection is not None:
      return rejection
  compiled = build(task, source)
  if not compiled.ok:
    return None
  return audit_lib.audit_library(compiled.library, pre.host, ("solution", prototype_lib.ENTRY_SYMBOL))


def static_check(task: task_lib.Task, source: str) -> static_check_lib.Rejection | None:
  """The parent-side check of a CUDA candidate (steps in the module docstring), failing closed: any
  error while checking it is the candidate's `static_check_failed`; only a machine that cannot
  isolate (`jail.IsolationUnavailable`) or has no toolchain is raised."""
  if pool_lib.has_gpu():
    runner_program()
  tc, arch = toolchain_lib.find_toolchain(), toolchain_lib.target_arch()
  try:
    return _check(task, source, tc, arch)
  except jail.IsolationUnavailable:
    raise
  except Exception as e:  # noqa: BLE001  (fail closed: a checker error is never a pass)
    return static_check_lib.Rejection("static_check_failed", "the static check could not process this source "
                                      f"({type(e).__name__}: {str(e)[:300]})")


BACKEND = backends.Backend(lang="cuda", fence_tags=("cuda", "cu", "cpp", "c++", "c"), static_check=static_check,
                           contract=render.cuda_contract, runner="kernels_eval.cuda.gpu_job:run", timeout_s=300.0)
