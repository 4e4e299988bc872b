"""KernelBench problem files, read with `ast` (never imported in the parent) and selected by level, id and split.

A KernelBench checkout holds `KernelBench/level<L>/<n>_<Name>.py`; each file defines `class Model(nn.Module)`,
`get_inputs()`, `get_init_inputs()` and module-level constants (`batch_size = 16`, `dim = 16384`, ...).
`find_problems(dir)` accepts the clone's root or its `KernelBench` folder. A problem's id is
`kb<L>_<n>` (level and the file's leading number); files without a leading number use their stem.

What the parent reads: the top-level integer constants (literals or `+ - * // **` of earlier ones), the
argument names of `Model.forward` (the candidates' input names) and whether the model uses dropout. Only
the sandboxed reference runner (`kernelbench.reference`) executes the file.

Split (`split_of`): a problem is "eval" when the first byte of sha256(id) is below 128 (about half), else
"train". It depends on the id alone, so train and eval never share a problem, whatever the selection.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import operator
import pathlib
import re
from typing import Sequence

_FILE_RE = re.compile(r"^(\d+)_")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Pow: operator.pow}
SPLITS = ("train", "eval")
REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")


class ProblemError(ValueError):
  """A problem file that cannot be used as a task; the message names the file and the reason."""


@dataclasses.dataclass(frozen=True)
class Problem:
  """One KernelBench problem file as parsed. `constants`: the integer size constants in file order."""
  id: str
  level: int
  name: str
  path: str
  source: str
  constants: dict[str, int]
  forward_args: tuple[str, ...]
  uses_dropout: bool

  @property
  def source_hash(self) -> str:
    return hashlib.sha256(self.source.encode("utf-8")).hexdigest()

  @property
  def split(self) -> str:
    return split_of(self.id)


def split_of(problem_id: str) -> str:
  """"eval" when sha256(id)[0] < 128, else "train" (see the module docstring)."""
  return "eval" if hashlib.sha256(problem_id.encode()).digest()[0] < 128 else "train"


def _int_value(node: ast.expr, known: dict[str, int]) -> int | None:
  """The value of an integer expression of literals and earlier constants, else None."""
  if isinstance(node, ast.Constant) and type(node.value) is int:
    return node.value
  if isinstance(node, ast.Name):
    return known.get(node.id)
  if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
    left, right = _int_value(node.left, known), _int_value(node.right, known)
    if left is None or right is None or (isinstance(node.op, ast.Pow) and not 0 <= right <= 64):
      return None
    if isinstance(node.op, ast.FloorDiv) and right == 0:
      return None
    return _OPS[type(node.op)](left, right)
  return None


def _constants(tree: ast.Module) -> dict[str, int]:
  known: dict[str, int] = {}
  for node in tree.body:
    if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
      value = _int_value(node.value, known)
      if value is not None:
        known.update({t.id: value for t in node.targets})
  return known


def _forward_args(path: pathlib.Path, model: ast.ClassDef) -> tuple[str, ...]:
  for node in model.body:
    if isinstance(node, ast.FunctionDef) and node.name == "forward":
      args = node.args
      if args.vararg or args.kwarg or args.kwonlyargs:
        raise ProblemError(f"{path}: Model.forward takes *args, **kwargs or keyword-only arguments")
      names = [a.arg for a in args.posonlyargs + args.args][1:]
      if not names:
        raise ProblemError(f"{path}: Model.forward takes no inputs")
      return tuple(names)
  raise ProblemError(f"{path}: Model has no forward method")


def parse_problem(path: str | pathlib.Path, level: int) -> Problem:
  """Parses one problem file (see the module docstring). Raises ProblemError."""
  path = pathlib.Path(path)
  try:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, str(path))
  except (OSError, UnicodeDecodeError, SyntaxError) as e:
    raise ProblemError(f"{path}: cannot be read or parsed ({e})") from None
  defined = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
  missing = [name for name in REQUIRED_NAMES if name not in defined]
  if missing:
    raise ProblemError(f"{path}: defines no {', '.join(missing)}")
  if not isinstance(defined["Model"], ast.ClassDef):
    raise ProblemError(f"{path}: Model is not a class")
  match = _FILE_RE.match(path.name)
  pid = f"kb{level}_{match.group(1)}" if match else f"kb{level}_{re.sub(r'[^a-z0-9_]', '_', path.stem.lower())}"
  return Problem(id=pid, level=level, name=path.stem, path=str(path), source=source, constants=_constants(tree),
                 forward_args=_forward_args(path, defined["Model"]),
                 uses_dropout=bool(re.search(r"\bdropout\b|\bDropout\w*\b", source, re.IGNORECASE)))


def suite_root(folder: str | pathlib.Path) -> pathlib.Path:
  """The folder holding `level<L>/`: `folder/KernelBench` when it exists, else `folder` itself."""
  folder = pathlib.Path(folder)
  inner = folder / "KernelBench"
  root = inner if inner.is_dir() else folder
  if not any(root.glob("level*/*.py")):
    raise ProblemError(f"{folder}: no KernelBench problem files (expected KernelBench/level<L>/<n>_<Name>.py)")
  return root


def find_problems(folder: str | pathlib.Path, levels: Sequence[int] = (), ids: Sequence[str] = (),
                  split: str = "") -> tuple[list[Problem], dict[str, str]]:
  """(problems, skipped {file: reason}) under `folder`, sorted by (level, number), kept when their level is in
  `levels`, their id in `ids` and their split is `split` (each filter off when empty)."""
  if split and split not in SPLITS:
    raise ValueError(f"split {split!r} is not one of {SPLITS}")
  problems, skipped = [], {}
  for level_dir in sorted(suite_root(folder).glob("level*")):
    level_text = level_dir.name[len("level"):]
    if not level_text.isdigit() or (levels and int(level_text) not in levels):
      continue
    for path in sorted(level_dir.glob("*.py")):
      try:
        problem = parse_problem(path, int(level_text))
      except ProblemError as e:
        skipped[str(path)] = str(e)
        continue
      if (not ids or problem.id in ids) and (not split or problem.split == split):
        problems.append(problem)
  return sorted(problems, key=_order), skipped


def _order(p: Problem) -> tuple:
  match = _FILE_RE.match(pathlib.Path(p.path).name)
  return (p.level, int(match.group(1)) if match else 1 << 30, p.name)
