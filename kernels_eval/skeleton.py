"""Level-0 answers: the line(s) that replace a skeleton's marker, and the source they complete.

A level-0 task's contract shows the whole kernel with the computation replaced by the marker line
`# >>> your code here <<<`. A reply may hold only the missing line(s): `fill_skeleton` inserts them at
the marker's indentation and the evaluator judges the completed source. A reply that defines
`solution` itself is taken as the whole source. `skeleton_answer` is the inverse: the lines of a
trusted solution that the skeleton leaves out (the cold-start SFT target).
"""
from __future__ import annotations

import re
import textwrap

from kernels_eval import task as task_lib

_DEFINES_SOLUTION = {
    "pallas": re.compile(r"^\s*def\s+solution\s*\(", re.MULTILINE),
    "cuda": re.compile(r"\bsolution\s*\("),
}


def _split(skeleton: str) -> tuple[list[str], str, list[str]]:
  """(lines before the marker, the marker's indentation, lines after it)."""
  lines = skeleton.strip("\n").splitlines()
  marked = [i for i, line in enumerate(lines) if line.strip() == task_lib.SKELETON_MARKER]
  if len(marked) != 1:
    raise ValueError(f"a skeleton needs exactly one line holding only {task_lib.SKELETON_MARKER!r}, "
                     f"found {len(marked)}")
  i = marked[0]
  return lines[:i], lines[i][:len(lines[i]) - len(lines[i].lstrip())], lines[i + 1:]


def has_skeleton(task: task_lib.Task, lang: str) -> bool:
  return lang in task.skeleton


def defines_solution(source: str, lang: str) -> bool:
  pattern = _DEFINES_SOLUTION.get(lang)
  return bool(pattern and pattern.search(source))


def fill_skeleton(task: task_lib.Task, lang: str, code: str) -> str:
  """The source to evaluate for `code`: the skeleton completed by `code` when `task` has a `lang` skeleton
  and `code` does not define `solution`, else `code` unchanged."""
  if not has_skeleton(task, lang) or defines_solution(code, lang):
    return code
  before, indent, after = _split(task.skeleton[lang])
  body = textwrap.dedent(code.strip("\n")).splitlines() or ["pass"]
  body = [indent + line if line.strip() else "" for line in body]
  return "\n".join(before + body + after) + "\n"


def skeleton_answer(task: task_lib.Task, lang: str) -> str:
  """The lines of the trusted `lang` solution that replace the skeleton's marker, dedented.

  Raises ValueError when the task has no such skeleton or solution, or when the solution does not keep
  the skeleton's lines before and after the marker.
  """
  if not has_skeleton(task, lang) or lang not in task.solutions:
    raise ValueError(f"task {task.id!r} has no {lang} skeleton and trusted solution")
  before, _, after = _split(task.skeleton[lang])
  lines = task.solutions[lang].strip("\n").splitlines()
  middle = lines[len(before):len(lines) - len(after)]
  if lines[:len(before)] != before or lines[len(lines) - len(after):] != after or not middle:
    raise ValueError(f"task {task.id!r}: the trusted {lang} solution does not complete its skeleton "
                     "(lines before or after the marker differ)")
  return textwrap.dedent("\n".join(middle)) + "\n"
