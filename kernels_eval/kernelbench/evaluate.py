"""One evaluation of a KernelBench task, parent side (called by `Evaluator` for tasks with `kernelbench` set).

Pallas: two jobs on the worker pool, each step in its own sandboxed child, so the problem's code and the
candidate never share a process.
  1. the reference job (`jobs.run_reference`): KernelBench's 5 trials then the project's EXTRA_TRIALS,
     inputs made in the worker; at the check sizes on a CPU, at the file's own sizes on a GPU (timed there
     when stages="full" and torch sees the GPU). Full-size inputs over `jobs.MAX_TRIAL_BYTES` are never
     sent: the evaluation falls back to the check sizes with the flag `full_size_skipped`.
  2. the candidate job: the Pallas runner on those inputs (forward inputs, then parameters), then the verdict
     against the reference's outputs (`verdicts.from_candidate`), timing included where the reference was timed.
A wrong output in one of the project's trials after KernelBench's own all passed is `wrong_output` with the
flag `stricter_than_kernelbench`. A "full" request that was not timed carries `timing_skipped` and says why.

CUDA (KernelBench's ModelNew answer): checked and compiled with nvcc against `torch_api.h` in the parent
(`answers`) everywhere; a compile error is `compile_error` at stage compile. Without a GPU (or for
stages="compile") that is all: `not_run`. On a GPU, the reference job as above (full size, timed for
"full"), then the `kernelbench_cuda` job (`cuda_runner`: build with torch's headers, ModelNew on the same
trials, timed the reference's way), judged as a Pallas candidate is; the speedup is reference_ms / kernel_ms.
"""
from __future__ import annotations

from kernels_eval import protocol
from kernels_eval import schema
from kernels_eval import verdicts
from kernels_eval.kernelbench import answers
from kernels_eval.kernelbench import jobs

STRICTER = "stricter_than_kernelbench"


def evaluate_cuda(pool, request, source: str, seed: int, timeout: float, gpu: bool, result,
                  prov: schema.Provenance) -> schema.EvalResult:
  """The verdict of a ModelNew answer that passed `answers.check_answer` (module docstring)."""
  answer, _ = answers.check_answer(source)
  compiled = answers.compile_answer(answer)
  if not compiled.ok:
    return result("compile_error", "compile", compiled.feedback or "nvcc failed")
  if not gpu or request.stages == "compile":
    why = "no GPU" if not gpu else "correctness not requested"
    return result("not_run", "compile", f"not_run: {why}. The answer passed the static checks and compiled with "
                  "nvcc against the allowed torch API; correctness was not checked.")
  run, flags = _reference(pool, request, seed, timeout, gpu)
  if run.error is not None:
    return result("runtime_error", "compile", "", infra_error=run.error)
  kb = request.task.kernelbench
  timed = run.report.reference_ms is not None
  payload = jobs.cuda_payload(kb, kb["sizes"] if flags else kb["full_sizes"], seed, answer.to_job(), source,
                              request.stages, time=timed)
  expect = protocol.Expect(len(run.trials), request.stages, timing=timed)
  return _judge(pool, request, jobs.CUDA_RUNNER, payload, expect, run, flags, timeout, result, prov,
                timeout + jobs.CUDA_BUILD_S)


def _reference(pool, request, seed: int, timeout: float, gpu: bool) -> tuple[jobs.ReferenceRun, list[str]]:
  kb = request.task.kernelbench
  timed = gpu and request.stages == "full"
  if gpu:
    run = jobs.run_reference(pool, kb, kb["full_sizes"], seed, timeout, full_size=True, time=timed)
    if not run.too_large_bytes:
      return run, []
    flag = [f"full_size_skipped: trial inputs of {run.too_large_bytes >> 20} MiB"]
  else:
    flag = []
  return jobs.run_reference(pool, kb, kb["sizes"], seed, timeout), flag


def _flagged(verdict: schema.EvalResult, flags: list[str], n_kernelbench: int, stages: str) -> schema.EvalResult:
  flags = flags + list(verdict.flags)
  if verdict.status == "wrong_output" and verdict.trials_passed >= n_kernelbench:
    flags.append(STRICTER)
    verdict.feedback = (f"{verdict.feedback}\n(KernelBench's own {n_kernelbench} trials passed; this project's "
                        "extra trials with normal-distributed inputs did not.)")
  if stages == "full" and verdict.status == "correct" and verdict.timing is None:
    flags.append("timing_skipped")
  verdict.flags = flags
  return verdict


def evaluate_pallas(pool, request, source: str, seed: int, timeout: float, gpu: bool, result,
                    prov: schema.Provenance) -> schema.EvalResult:
  """The two jobs of the module docstring and the verdict."""
  run, flags = _reference(pool, request, seed, timeout, gpu)
  if run.error is not None:
    return result("runtime_error", "compile", "", infra_error=run.error)
  kb = request.task.kernelbench
  sizes = kb["full_sizes"] if gpu and not flags else kb["sizes"]
  payload = {"task": request.task.to_job(), "source": source, "stages": request.stages, "trials": run.trials,
             "trial_dims": [sizes] * len(run.trials), "input_dtypes": [x.dtype.name for x in run.trials[0]]}
  if run.report.reference_ms is not None:
    payload["timing_trials"], payload["timing_dims"] = [run.trials[0]], sizes
  expect = protocol.Expect(len(run.trials), request.stages, timing="timing_trials" in payload)
  return _judge(pool, request, request.lang, payload, expect, run, flags, timeout, result, prov, timeout)


def _judge(pool, request, runner: str, payload: dict, expect: protocol.Expect, run: jobs.ReferenceRun,
           flags: list[str], timeout: float, result, prov: schema.Provenance, limit_s: float) -> schema.EvalResult:
  """The candidate job (`runner` on `payload`, `limit_s` seconds) judged against the reference run."""
  outcome = pool.submit([runner], payload, limit_s).result()
  if outcome.infra_error:
    return result("runtime_error", "compile", "", infra_error=outcome.infra_error)
  prov.toolchain = dict(outcome.toolchain)
  verdict = verdicts.from_candidate(request.task, request.stages, run.report, outcome.steps.get(runner), expect,
                                    run.trials, timeout, result, prov)
  return _flagged(verdict, flags, jobs.KERNELBENCH_TRIALS, request.stages)
