"""Kernel tasks and the sandboxed evaluator. Importing this package never imports JAX.

Public API:
  load_tasks(folder=None) -> list[Task]           parse task files (ast only); None = the embedded suite
  render_task(task, lang) -> str                  statement, reference and the exact kernel contract
  validate_task(task, ...) -> TaskVerdict          run the reference in the sandbox, reject degenerate tasks
  extract_code(response_text, lang, task=None)     the kernel source in a model reply (NoCodeBlock if none)
  EvalRequest(task, source, lang, stages, request_id)
  evaluate(task, source, lang, *, stages="full", request_id=None) -> EvalResult
  Evaluator(executor="local", workers=2).evaluate_many(requests) -> list[EvalResult]; .submit(request)

Every job runs in kernel-level isolation (`kernels_eval.jail`: namespaces, a read-only allowlisted view of
the files, an unprivileged uid); an evaluator refuses to start where that cannot be set up, unless
`isolation="process"` opts out. The reference and the candidate run in separate processes, and the parent
accepts their frames only in protocol order (`kernels_eval.protocol`).
"""
from kernels_eval.evaluator import EvalRequest
from kernels_eval.evaluator import Evaluator
from kernels_eval.evaluator import evaluate
from kernels_eval.evaluator import missing_code_result
from kernels_eval.extract import NoCodeBlock
from kernels_eval.extract import extract_code
from kernels_eval.render import cuda_prototype
from kernels_eval.render import render_task
from kernels_eval.schema import EvalResult
from kernels_eval.task import Task
from kernels_eval.task import TaskFormatError
from kernels_eval.task import load_tasks
from kernels_eval.validate import TaskVerdict
from kernels_eval.validate import validate_task

__all__ = [
    "EvalRequest", "EvalResult", "Evaluator", "NoCodeBlock", "Task", "TaskFormatError", "TaskVerdict",
    "cuda_prototype", "evaluate", "extract_code", "load_tasks", "missing_code_result", "render_task",
    "validate_task",
]
