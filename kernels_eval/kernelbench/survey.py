"""What of a KernelBench clone this project can use: per level, problem files found, parsed and loaded.

A problem *loads* when its file parses (`problems`) and its torch reference runs in the sandbox at the check
sizes (`tasks.load_tasks`): such a task is judged on a CPU (Pallas answers) and trains there. The survey runs
every reference once, like loading does, and keeps each skipped problem's reason.
"""
from __future__ import annotations

import collections
import pathlib
from typing import Any, Sequence

from kernels_eval.kernelbench import problems as problems_lib
from kernels_eval.kernelbench import tasks as tasks_lib


def survey(folder: str, evaluator, levels: Sequence[int] = ()) -> dict[str, Any]:
  """{"levels": {L: {"files", "parsed", "loaded", "dropout_eval"}}, "skipped": {file or id: reason}} of `folder`.

  "files" counts `level<L>/*.py`; "parsed" the problems whose file parses; "loaded" those whose reference ran
  at check sizes; "dropout_eval" the loaded ones that run their dropout in eval mode."""
  root = problems_lib.suite_root(folder)
  counts: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
  for level_dir in sorted(root.glob("level*")):
    level = level_dir.name[len("level"):]
    if level.isdigit() and (not levels or int(level) in levels):
      counts[int(level)]["files"] = len(list(level_dir.glob("*.py")))
  parsed, _ = problems_lib.find_problems(folder, levels)
  loaded, skipped = tasks_lib.load_tasks(folder, evaluator, levels)
  for problem in parsed:
    counts[problem.level]["parsed"] += 1
  for task in loaded:
    counts[task.level]["loaded"] += 1
    counts[task.level]["dropout_eval"] += int(task.kernelbench["dropout_eval"])
  fields = ("files", "parsed", "loaded", "dropout_eval")
  return {"levels": {level: {k: c[k] for k in fields} for level, c in sorted(counts.items())},
          "skipped": {_short(k, root): v for k, v in sorted(skipped.items())}}


def _short(key: str, root: pathlib.Path) -> str:
  """A skipped file's path relative to the suite root (ids stay as they are)."""
  path = pathlib.Path(key)
  return str(path.relative_to(root)) if path.is_relative_to(root) else key


def table(result: dict[str, Any]) -> str:
  """The survey as a markdown table, one row per level."""
  lines = ["| level | files | parsed | loaded (evaluate on CPU) | of which dropout in eval mode |",
           "|---|---|---|---|---|"]
  for level, c in result["levels"].items():
    lines.append(f"| {level} | {c['files']} | {c['parsed']} | {c['loaded']} | {c['dropout_eval']} |")
  return "\n".join(lines)
