"""Kernel tasks: parsing task files (with `ast`, never importing them) and loading the embedded suite.

The file format is described in `tasks/FORMAT.md`. Parsing runs no task code, so the parent process
stays free of JAX; a task's `reference` is run only inside a sandboxed worker.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import math
import pathlib
import re
from typing import Any, Sequence

from kernels_eval import schema
from kernels_eval import static_check

TASKS_DIR = pathlib.Path(__file__).resolve().parent / "tasks"
DTYPES = ("float32", "float16", "bfloat16", "int32")
DIST_KINDS = {"normal": (), "uniform": ("low", "high"), "positive": (), "randint": ("low", "high")}
DEFAULT_TOLERANCE = {"float32": {"atol": 1e-4, "rtol": 1e-4}, "float16": {"atol": 1e-2, "rtol": 1e-2},
                     "bfloat16": {"atol": 1e-2, "rtol": 1e-2}, "int32": {"atol": 0.0, "rtol": 0.0},
                     "int64": {"atol": 0.0, "rtol": 0.0}, "bool": {"atol": 0.0, "rtol": 0.0}}
SKELETON_MARKER = "# >>> your code here <<<"
REQUIRED = ("ID", "LEVEL", "SPLIT", "FAMILY", "STATEMENT", "DIMS", "INPUTS")
OPTIONAL = ("TOLERANCE", "SOLUTIONS", "SKELETON")
TOP_LEVEL_IMPORTS = {("import", "jax", None), ("import", "jax.numpy", "jnp"), ("from", "jax", "lax"),
                     ("import", "math", None)}
_ID_RE = re.compile(r"^[a-z0-9_]+$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class TaskFormatError(ValueError):
  """A task file breaks FORMAT.md; the message names the file and the field."""

  def __init__(self, path: str | pathlib.Path, field: str, problem: str):
    super().__init__(f"{path}: {field}: {problem}")
    self.path, self.field, self.problem = str(path), field, problem


@dataclasses.dataclass(frozen=True)
class InputSpec:
  name: str
  shape: tuple[str | int, ...]
  dtype: str
  dist: dict[str, Any]

  def concrete_shape(self, dims: dict[str, int]) -> tuple[int, ...]:
    return tuple(dims[d] if isinstance(d, str) else d for d in self.shape)


@dataclasses.dataclass(frozen=True)
class Task:
  """One parsed task. `trusted` is True only for the embedded suite (its reference is not static-checked).

  `kernelbench`: None for tasks in this project's format; for a KernelBench problem
  (`kernels_eval.kernelbench`) the JSON-safe description its reference runner needs (problem source,
  sizes, the names, shapes and dtypes of its inputs, parameters and output).
  """
  id: str
  level: int
  split: str
  family: str
  statement: str
  dims: dict[str, Any]
  inputs: tuple[InputSpec, ...]
  tolerance: dict[str, dict[str, float]]
  reference_source: str
  solutions: dict[str, str]
  skeleton: dict[str, str]
  source_hash: str
  path: str
  trusted: bool = False
  kernelbench: dict[str, Any] | None = None

  @property
  def check_dims(self) -> list[dict[str, int]]:
    return list(self.dims["check"])

  @property
  def timing_dims(self) -> dict[str, int]:
    return dict(self.dims["timing"])

  @property
  def dim_names(self) -> list[str]:
    return list(self.dims["timing"])

  @property
  def input_names(self) -> list[str]:
    return [i.name for i in self.inputs]

  def tolerance_for(self, dtype: str) -> dict[str, float]:
    return self.tolerance.get(dtype, DEFAULT_TOLERANCE.get(dtype, DEFAULT_TOLERANCE["float32"]))

  def to_job(self) -> dict[str, Any]:
    """The JSON-safe part a worker needs to run the reference."""
    job = {"id": self.id, "reference_source": self.reference_source, "input_names": self.input_names,
           "dim_names": self.dim_names, "source_hash": self.source_hash}
    return {**job, "kernelbench": self.kernelbench} if self.kernelbench is not None else job


def _literal(path, field: str, node: ast.AST) -> Any:
  try:
    return ast.literal_eval(node)
  except (ValueError, TypeError, SyntaxError) as e:
    raise TaskFormatError(path, field, f"must be a literal ({e})") from None


def _is_pow2(n: int) -> bool:
  return n > 0 and n & (n - 1) == 0


def _check_dims(path, dims: Any) -> dict[str, Any]:
  if not isinstance(dims, dict) or set(dims) != {"check", "timing"}:
    raise TaskFormatError(path, "DIMS", "must be a dict with exactly the keys 'check' and 'timing'")
  check, timing = dims["check"], dims["timing"]
  if not isinstance(timing, dict) or not timing:
    raise TaskFormatError(path, "DIMS.timing", "must be a non-empty dict {name: int}")
  if not isinstance(check, list) or not check:
    raise TaskFormatError(path, "DIMS.check", "must be a non-empty list of dicts")
  for i, entry in enumerate([timing, *check]):
    where = "DIMS.timing" if i == 0 else f"DIMS.check[{i - 1}]"
    if not isinstance(entry, dict) or set(entry) != set(timing):
      raise TaskFormatError(path, where, f"must have the same keys as DIMS.timing {list(timing)}")
    for k, v in entry.items():
      if not (isinstance(k, str) and _IDENT_RE.match(k)):
        raise TaskFormatError(path, where, f"dim name {k!r} is not an identifier")
      if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
        raise TaskFormatError(path, where, f"dim {k}={v!r} must be a positive int")
  if not any(c != timing and any(not _is_pow2(v) for v in c.values()) for c in check):
    raise TaskFormatError(path, "DIMS.check", "needs an entry that differs from timing and has a size "
                          "that is not a power of two")
  return {"check": [dict(c) for c in check], "timing": dict(timing)}


def _check_inputs(path, inputs: Any, dims: dict[str, Any]) -> tuple[InputSpec, ...]:
  if not isinstance(inputs, list) or not inputs:
    raise TaskFormatError(path, "INPUTS", "must be a non-empty list of dicts")
  out, seen = [], set()
  for i, spec in enumerate(inputs):
    where = f"INPUTS[{i}]"
    if not isinstance(spec, dict) or set(spec) != {"name", "shape", "dtype", "dist"}:
      raise TaskFormatError(path, where, "must have exactly the keys name, shape, dtype, dist")
    name = spec["name"]
    if not (isinstance(name, str) and _IDENT_RE.match(name)) or name in seen or name == "solution":
      raise TaskFormatError(path, f"{where}.name", f"{name!r} must be a new identifier")
    seen.add(name)
    shape = spec["shape"]
    if not isinstance(shape, list):
      raise TaskFormatError(path, f"{where}.shape", "must be a list of dim names or ints")
    for d in shape:
      if isinstance(d, str) and d not in dims["timing"]:
        raise TaskFormatError(path, f"{where}.shape", f"dim {d!r} is not in DIMS")
      if not isinstance(d, str) and not (isinstance(d, int) and d > 0):
        raise TaskFormatError(path, f"{where}.shape", f"{d!r} is neither a dim name nor a positive int")
    if spec["dtype"] not in DTYPES:
      raise TaskFormatError(path, f"{where}.dtype", f"{spec['dtype']!r} is not one of {DTYPES}")
    dist = spec["dist"]
    if not isinstance(dist, dict) or dist.get("kind") not in DIST_KINDS:
      raise TaskFormatError(path, f"{where}.dist", f"kind must be one of {sorted(DIST_KINDS)}")
    need = DIST_KINDS[dist["kind"]]
    if set(dist) != {"kind", *need} or not all(isinstance(dist[k], (int, float)) for k in need):
      raise TaskFormatError(path, f"{where}.dist", f"kind {dist['kind']!r} takes numeric {list(need)}")
    if need and not dist["low"] < dist["high"]:
      raise TaskFormatError(path, f"{where}.dist", "needs low < high")
    if dist["kind"] == "randint" and spec["dtype"] != "int32":
      raise TaskFormatError(path, f"{where}.dist", "randint needs dtype int32")
    out.append(InputSpec(name, tuple(shape), spec["dtype"], dict(dist)))
  return tuple(out)


def _check_tolerance(path, tol: Any) -> dict[str, dict[str, float]]:
  if not isinstance(tol, dict):
    raise TaskFormatError(path, "TOLERANCE", "must be a dict {dtype: {atol, rtol}}")
  for k, v in tol.items():
    if k not in DTYPES:
      raise TaskFormatError(path, "TOLERANCE", f"dtype {k!r} is not one of {DTYPES}")
    if not isinstance(v, dict) or set(v) != {"atol", "rtol"} or not all(
        isinstance(x, (int, float)) and 0 <= x < 1 for x in v.values()):
      raise TaskFormatError(path, f"TOLERANCE.{k}", "must be {'atol': float, 'rtol': float} in [0, 1)")
  return {k: {"atol": float(v["atol"]), "rtol": float(v["rtol"])} for k, v in tol.items()}


def _check_str_dict(path, field: str, value: Any) -> dict[str, str]:
  if not isinstance(value, dict) or not all(k in schema.LANGS and isinstance(v, str) for k, v in value.items()):
    raise TaskFormatError(path, field, f"must be a dict {{lang: source}} with lang in {schema.LANGS}")
  return dict(value)


def _import_key(node: ast.stmt) -> set[tuple]:
  if isinstance(node, ast.Import):
    return {("import", a.name, a.asname) for a in node.names}
  assert isinstance(node, ast.ImportFrom)
  return {("from", node.module, a.name if a.asname in (None, a.name) else f"{a.name} as {a.asname}")
          for a in node.names} if node.level == 0 else {("relative",)}


def parse_task_source(text: str, path: str | pathlib.Path, *, trusted: bool = False,
                      require_skeleton: bool = True) -> Task:
  """Parses one task file's text. Raises TaskFormatError naming `path` and the field.

  `require_skeleton=False` accepts a level-0 task without its SKELETON (one whose scaffold is still to be
  written, as for generated tasks).
  """
  path = pathlib.Path(path)
  values, reference = _module_fields(text, path)
  _check_header(path, values)
  dims = _check_dims(path, values["DIMS"])
  inputs = _check_inputs(path, values["INPUTS"], dims)
  reference_source = _reference_source(path, text, reference, inputs, trusted=trusted)
  tolerance, solutions, skeleton = _check_optional(path, values, require_skeleton=require_skeleton)
  return Task(id=values["ID"], level=values["LEVEL"], split=values["SPLIT"], family=values["FAMILY"],
              statement=values["STATEMENT"].strip(), dims=dims, inputs=inputs, tolerance=tolerance,
              reference_source=reference_source, solutions=solutions, skeleton=skeleton,
              source_hash=hashlib.sha256(text.encode("utf-8")).hexdigest(), path=str(path), trusted=trusted)


def _module_fields(text: str, path: pathlib.Path) -> tuple[dict[str, Any], ast.FunctionDef]:
  """The literal values of the FORMAT.md names and the `reference` function of a task file's top level.

  Allows only a docstring, the allowed imports, `reference` and one assignment per name; checks that every
  REQUIRED name and `reference` are there.
  """
  try:
    tree = static_check.parse_python(text, str(path))
  except SyntaxError as e:
    raise TaskFormatError(path, f"line {e.lineno}", f"syntax error: {e.msg}") from None
  values: dict[str, Any] = {}
  reference: ast.FunctionDef | None = None
  for i, node in enumerate(tree.body):
    if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(
        node.value.value, str):
      continue
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      bad = _import_key(node) - TOP_LEVEL_IMPORTS
      if bad:
        raise TaskFormatError(path, f"line {node.lineno}", "only `import jax`, `import jax.numpy as jnp`, "
                              "`from jax import lax` and `import math` are allowed at top level")
      continue
    if isinstance(node, ast.FunctionDef) and node.name == "reference" and reference is None:
      reference = node
      continue
    if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id in REQUIRED + OPTIONAL and node.targets[0].id not in values):
      name = node.targets[0].id
      values[name] = _literal(path, name, node.value)
      continue
    raise TaskFormatError(path, f"line {node.lineno}", f"unexpected top-level statement "
                          f"({type(node).__name__}); only the names of FORMAT.md, imports and `reference`")
  for name in REQUIRED:
    if name not in values:
      raise TaskFormatError(path, name, "is missing")
  if reference is None:
    raise TaskFormatError(path, "reference", "function `reference` is missing")
  return values, reference


def _check_header(path: pathlib.Path, values: dict[str, Any]) -> None:
  """Checks ID, LEVEL (against the file stem and a `level<n>` folder), SPLIT, FAMILY and STATEMENT."""
  tid = values["ID"]
  if not (isinstance(tid, str) and _ID_RE.match(tid)):
    raise TaskFormatError(path, "ID", f"{tid!r} must match [a-z0-9_]+")
  if path.suffix == ".py" and tid != path.stem:
    raise TaskFormatError(path, "ID", f"{tid!r} must equal the file stem {path.stem!r}")
  level = values["LEVEL"]
  if level not in (0, 1, 2, 3) or isinstance(level, bool):
    raise TaskFormatError(path, "LEVEL", f"{level!r} must be 0, 1, 2 or 3")
  if re.fullmatch(r"level\d", path.parent.name) and path.parent.name != f"level{level}":
    raise TaskFormatError(path, "LEVEL", f"{level} does not match the folder {path.parent.name}")
  if values["SPLIT"] not in ("train", "eval"):
    raise TaskFormatError(path, "SPLIT", f"{values['SPLIT']!r} must be 'train' or 'eval'")
  for name in ("FAMILY", "STATEMENT"):
    if not (isinstance(values[name], str) and values[name].strip()):
      raise TaskFormatError(path, name, "must be a non-empty string")


def _reference_source(path: pathlib.Path, text: str, reference: ast.FunctionDef, inputs: tuple[InputSpec, ...],
                      *, trusted: bool) -> str:
  """The source of `reference` after checking its signature (the input names) and, unless trusted, its code."""
  args = reference.args
  arg_names = [a.arg for a in args.posonlyargs + args.args]
  if arg_names != [i.name for i in inputs] or args.vararg or args.kwarg or args.kwonlyargs or args.defaults:
    raise TaskFormatError(path, "reference", f"signature must be reference({', '.join(i.name for i in inputs)})")
  reference_source = ast.get_source_segment(text, reference, padded=True)
  if not trusted:
    problem = static_check.check_reference(reference_source)
    if problem is not None:
      raise TaskFormatError(path, "reference", f"{problem.reason}: {problem.message}")
  return reference_source


def _check_optional(path: pathlib.Path, values: dict[str, Any], *, require_skeleton: bool
                    ) -> tuple[dict[str, dict[str, float]], dict[str, str], dict[str, str]]:
  """(tolerance, solutions, skeleton) from TOLERANCE, SOLUTIONS and SKELETON (each {} when absent)."""
  tolerance = _check_tolerance(path, values.get("TOLERANCE", {}))
  solutions = _check_str_dict(path, "SOLUTIONS", values.get("SOLUTIONS", {}))
  skeleton = _check_str_dict(path, "SKELETON", values.get("SKELETON", {}))
  if require_skeleton and values["LEVEL"] == 0 and SKELETON_MARKER not in skeleton.get("pallas", ""):
    raise TaskFormatError(path, "SKELETON", f"level 0 needs SKELETON['pallas'] containing {SKELETON_MARKER!r}")
  return tolerance, solutions, skeleton


def drop_assignments(text: str, names: Sequence[str]) -> str:
  """Task file text without its top-level `NAME = ...` assignments for `names` (source lines removed, the rest
  verbatim)."""
  tree = static_check.parse_python(text)
  drop = set()
  for node in tree.body:
    if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id in names):
      drop.update(range(node.lineno - 1, node.end_lineno))
  return "".join(line for i, line in enumerate(text.splitlines(keepends=True)) if i not in drop)


def parse_task_file(path: str | pathlib.Path, *, trusted: bool = False) -> Task:
  path = pathlib.Path(path)
  try:
    text = path.read_text(encoding="utf-8")
  except (OSError, UnicodeDecodeError) as e:
    raise TaskFormatError(path, "file", f"cannot be read ({e})") from None
  return parse_task_source(text, path, trusted=trusted)


def load_tasks(folder: str | pathlib.Path | None = None) -> list[Task]:
  """Parses every `level*/<id>.py` under `folder` (None: the embedded suite), sorted by (level, id).

  Tasks of the embedded suite are trusted; tasks from any other folder are untrusted code and get the
  candidates' static checks on their reference. Raises TaskFormatError on the first malformed file.
  """
  root = TASKS_DIR if folder is None else pathlib.Path(folder)
  if not root.is_dir():
    raise TaskFormatError(root, "folder", "is not a directory")
  trusted = folder is None
  files = sorted(root.glob("level*/*.py"))
  tasks = [parse_task_file(p, trusted=trusted) for p in files if p.name != "__init__.py"]
  seen: dict[str, str] = {}
  for t in tasks:
    if t.id in seen:
      raise TaskFormatError(t.path, "ID", f"{t.id!r} already used by {seen[t.id]}")
    seen[t.id] = t.path
  return sorted(tasks, key=lambda t: (t.level, t.id))


def task_sizes(task: Task) -> dict[str, int]:
  """Largest element count of any input over the check dims and at the timing dims."""
  check = max(math.prod(i.concrete_shape(d)) for d in task.check_dims for i in task.inputs)
  timing = max(math.prod(i.concrete_shape(task.timing_dims)) for i in task.inputs)
  return {"check_elements": check, "timing_elements": timing}
