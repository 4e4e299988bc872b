"""Task generation in the suite's own file format: the prompt, parsing, validity and near-duplicate checks.

A generated task is *valid* iff
  1. the reply holds a task file that `kernels_eval` parses (FORMAT.md, static checks on `reference`) at one
     of the requested levels,
  2. its normalised source hash differs from every known task's (suite tasks and earlier generations),
  3. `kernels_eval.validate_task` accepts it (reference runs in the sandbox, outputs are not degenerate), and
  4. at level 0, the harness's scaffold fits it (probe/scaffold.py): the generator writes no SKELETON (one it
     writes anyway is replaced); the checked text carries the harness's skeleton, which the reference's own
     body completes to a kernel the evaluator judges correct.
Every failure carries a reason: "parse: ...", "duplicate: ...", "invalid: ...", "scaffold: ...".

The normalised source drops the docstring, ID, SPLIT, STATEMENT, SOLUTIONS and SKELETON, comments and all
whitespace, and lower-cases the rest, so renaming a task or rewording its statement does not make it new.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import pathlib
import re
from typing import Callable, Iterable, Sequence

import numpy as np

import kernels_eval
from kernels_eval import skeleton as skeleton_lib
from kernels_eval import static_check
from kernels_eval import task as task_lib
from probe import scaffold

GENERATED_LEVELS = (1, 2, 3)
LEVEL_MEANINGS = {0: "0 complete the kernel body", 1: "1 single op", 2: "2 fusion", 3: "3 small block"}
_STRIPPED = ("SOLUTIONS", "SKELETON")  # the harness writes level-0 skeletons (probe/scaffold.py)
_IGNORED_IN_HASH = ("ID", "SPLIT", "STATEMENT", "SOLUTIONS", "SKELETON")
_FENCE_RE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def instructions(levels: Sequence[int] = GENERATED_LEVELS) -> str:
  """The generator's task-format instructions for tasks at `levels`."""
  level_text = ", ".join(LEVEL_MEANINGS[level] for level in levels)
  skeleton = ("- at level 0, no SKELETON: the harness writes the kernel around `reference`, which must be "
              "elementwise over\n  one 2-D shape or reduce each row of one 2-D input;\n" if 0 in levels else "")
  return ("You design GPU-kernel programming tasks. A task is one Python file in this exact format:\n"
          "- top-level imports only `import jax`, `import jax.numpy as jnp`, `from jax import lax`, `import math`;\n"
          f"- literals ID (lower-case [a-z0-9_]), LEVEL ({level_text}), SPLIT = \"train\", FAMILY,\n"
          "  STATEMENT (what to compute, in plain words), DIMS ({\"check\": [...], \"timing\": {...}}, one check "
          "entry with a\n  size that is not a power of two), INPUTS (name, shape, dtype, dist), optional TOLERANCE;\n"
          "- a function `reference(<input names>)` written with jnp/jax/lax that returns one array;\n"
          f"{skeleton}"
          "Do not write any solution. Here are tasks of the suite:\n")


def strip_solutions(text: str) -> str:
  """The task file without its SOLUTIONS and SKELETON assignments (source lines removed, the rest verbatim)."""
  return re.sub(r"\n{3,}", "\n\n\n", task_lib.drop_assignments(text, _STRIPPED)).rstrip() + "\n"


def suite_examples(levels: Sequence[int] = GENERATED_LEVELS) -> list[str]:
  """Embedded suite task files at `levels`, solutions and skeletons removed, sorted by (level, id)."""
  return [strip_solutions(pathlib.Path(t.path).read_text()) for t in kernels_eval.load_tasks()
          if t.level in tuple(levels)]


def generator_prompt(examples: Sequence[str], *, num_shots: int = 2, seed: int = 0,
                     levels: Sequence[int] = GENERATED_LEVELS) -> str:
  """The user message asking for one new task at `levels`, with `num_shots` examples drawn by `seed`.

  Args:
    examples: task file texts without solutions (`suite_examples(levels)`).
    num_shots: examples shown.
    seed: which examples (numpy Generator over `examples`).
    levels: the levels a new task may have (named in the instructions).
  """
  if not 0 < num_shots <= len(examples):
    raise ValueError(f"num_shots={num_shots} must be in [1, {len(examples)}]")
  pick = np.random.default_rng(seed).choice(len(examples), num_shots, replace=False)
  shots = "\n".join(f"```python\n{examples[i].strip()}\n```\n" for i in sorted(pick))
  return (f"{instructions(levels)}\n{shots}\nWrite one new task, different from these, as a single ```python "
          "block.")


def extract_task_source(reply: str) -> str:
  """The task file in a generator reply: the first fenced block that defines `reference`, else the reply."""
  for block in _FENCE_RE.findall(reply):
    if "def reference" in block:
      return block.strip() + "\n"
  return reply.strip() + "\n"


def normalized_source(text: str) -> str:
  """Source with the fields of the module docstring dropped, comments/whitespace removed, lower-cased."""
  try:
    tree = static_check.parse_python(text)
  except SyntaxError:
    body = re.sub(r"#[^\n]*", "", text)
  else:
    keep = []
    for i, node in enumerate(tree.body):
      if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        continue
      if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
          and node.targets[0].id in _IGNORED_IN_HASH):
        continue
      if isinstance(node, ast.FunctionDef):
        node = _strip_docstring(node)
      keep.append(node)
    body = ast.unparse(ast.Module(body=keep, type_ignores=[]))
  return re.sub(r"\s+", "", body).lower()


def _strip_docstring(fn: ast.FunctionDef) -> ast.FunctionDef:
  body = fn.body
  if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
    fn = ast.FunctionDef(**{**{f: getattr(fn, f) for f in fn._fields}, "body": body[1:]})
  return fn


def normalized_hash(text: str) -> str:
  return hashlib.sha256(normalized_source(text).encode()).hexdigest()


def runtime_key(task: task_lib.Task) -> str:
  """Hash of what validation depends on: reference, dims, inputs, tolerance (not id, statement or family)."""
  payload = json.dumps([normalized_source(task.reference_source), task.dims,
                        [dataclasses.astuple(i) for i in task.inputs], task.tolerance], sort_keys=True, default=str)
  return hashlib.sha256(payload.encode()).hexdigest()


@dataclasses.dataclass
class GeneratedTask:
  """One checked generation.

  text: the extracted task file; task: the parsed Task when parsing succeeded; valid: all checks passed;
  reason: "" when valid, else "<check>: <detail>"; norm_hash: `normalized_hash(text)`.
  """
  text: str
  task: task_lib.Task | None
  valid: bool
  reason: str
  norm_hash: str

  @property
  def family(self) -> str:
    return self.task.family if self.task is not None else ""


class TaskChecker:
  """Checks generated task files for validity (module docstring); remembers hashes of valid ones.

  Args:
    known_texts: task files that count as existing (default: the embedded suite).
    levels: the levels a generated task may have.
    validate: `fn(task) -> kernels_eval.TaskVerdict` (default `kernels_eval.validate_task` with `cache_dir`).
    cache_dir: validation verdict cache (kernels_eval's default when None).
    remember: add each valid task's hash to the known set (so later copies are duplicates).
    judge: `fn(task, pallas_source) -> kernels_eval.EvalResult` for level-0 scaffolds (default: the
      evaluator's correctness stages).
  """

  def __init__(self, known_texts: Iterable[str] | None = None, *, levels: Sequence[int] = GENERATED_LEVELS,
               validate: Callable[[task_lib.Task], kernels_eval.TaskVerdict] | None = None,
               cache_dir: str | None = None, remember: bool = True,
               judge: Callable[[task_lib.Task, str], kernels_eval.EvalResult] | None = None):
    self.levels = tuple(levels)
    if known_texts is None:
      known_texts = [pathlib.Path(t.path).read_text() for t in kernels_eval.load_tasks()]
    self.known = {normalized_hash(t) for t in known_texts}
    self._validate = validate or (lambda t: kernels_eval.validate_task(t, cache_dir=cache_dir))
    self._judge = judge or (lambda t, source: kernels_eval.evaluate(t, source, "pallas", stages="correctness"))
    self._verdicts: dict[str, kernels_eval.TaskVerdict] = {}
    self._scaffolds: dict[str, tuple[str, str]] = {}
    self.remember = remember

  def check(self, text: str) -> GeneratedTask:
    norm = normalized_hash(text)
    try:
      task = task_lib.parse_task_source(text, "<generated>", require_skeleton=False)
    except task_lib.TaskFormatError as e:
      return GeneratedTask(text, None, False, f"parse: {e.field}: {e.problem}", norm)
    if task.level not in self.levels:
      return GeneratedTask(text, task, False, f"parse: LEVEL: {task.level} is not one of {self.levels}", norm)
    if norm in self.known:
      return GeneratedTask(text, task, False, "duplicate: same normalised source as an existing task", norm)
    key = runtime_key(task)
    if key not in self._verdicts:
      self._verdicts[key] = self._validate(task)
    verdict = self._verdicts[key]
    if not verdict.ok:
      return GeneratedTask(text, task, False, "invalid: " + "; ".join(verdict.reasons), norm)
    if task.level == 0:
      if key not in self._scaffolds:
        self._scaffolds[key] = self._scaffold(task, verdict)
      skeleton, problem = self._scaffolds[key]
      if problem:
        return GeneratedTask(text, task, False, f"scaffold: {problem}", norm)
      text = scaffold.with_skeleton(text, skeleton)
      task = task_lib.parse_task_source(text, "<generated>")
    if self.remember:
      self.known.add(norm)
    return GeneratedTask(text, task, True, "", norm)

  def _scaffold(self, task: task_lib.Task, verdict: kernels_eval.TaskVerdict) -> tuple[str, str]:
    """(skeleton, "") when the harness's scaffold fits `task`, else ("", why not)."""
    try:
      skeleton = scaffold.skeleton(task, verdict.details["output_shape"])
      body = scaffold.witness(task.reference_source)
    except scaffold.NoScaffold as e:
      return "", str(e)
    scaffolded = dataclasses.replace(task, skeleton={**task.skeleton, "pallas": skeleton})
    result = self._judge(scaffolded, skeleton_lib.fill_skeleton(scaffolded, "pallas", body))
    if result.status != "correct":
      detail = (result.rejected_reason or result.feedback or "").strip().splitlines()
      return "", (f"the reference's own body does not complete the skeleton ({result.status}"
                  + (f": {detail[0][:200]}" if detail else "") + ")")
    return skeleton, ""


def _replace_literal(text: str, name: str, value: str) -> str:
  tree = static_check.parse_python(text)
  lines = text.splitlines(keepends=True)
  for node in tree.body:
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name:
      start, end = node.lineno - 1, node.end_lineno
      return "".join(lines[:start]) + f"{name} = {value!r}\n" + "".join(lines[end:])
  raise ValueError(f"task source has no {name} assignment")


def export_tasks(texts: Iterable[str], folder: str | pathlib.Path, *, split: str = "train") -> list[pathlib.Path]:
  """Writes valid task files to `folder/level<L>/gen_<hash>.py` (ID = stem, SPLIT = `split`).

  The folder loads with `kernels_eval.load_tasks(folder)`. Files whose normalised source repeats are
  written once. Returns the written paths.
  """
  folder = pathlib.Path(folder)
  written, seen = [], set()
  for text in texts:
    norm = normalized_hash(text)
    if norm in seen:
      continue
    seen.add(norm)
    task_id = f"gen_{norm[:12]}"
    out = _replace_literal(_replace_literal(text, "ID", task_id), "SPLIT", split)
    task = task_lib.parse_task_source(out, "<export>")
    path = folder / f"level{task.level}" / f"{task_id}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(out)
    written.append(path)
  return written
