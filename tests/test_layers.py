"""The library's layers point one way: rewards <- models <- sampling <- rollout <- metrics <- train <- probe, with
kernels_eval below all of them and configs/, launch/, bench/ above. Walks every import (also those inside
functions) with `ast` and fails on an upward import or an import cycle between modules."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = ("kernels_eval", "leap_jax.rewards", "leap_jax.models", "leap_jax.sampling", "leap_jax.rollout",
          "leap_jax.metrics", "leap_jax.train", "probe", "configs", ("launch", "bench"))
PACKAGES = ("kernels_eval", "leap_jax", "probe", "configs", "launch", "bench")


def _layer(module: str) -> int | None:
  """Index in LAYERS of the layer `module` belongs to (None: outside the project, or `leap_jax` itself)."""
  for i, names in enumerate(LAYERS):
    for name in (names,) if isinstance(names, str) else names:
      if module == name or module.startswith(name + "."):
        return i
  return None


def _module_name(path: pathlib.Path, root: pathlib.Path = ROOT) -> str:
  parts = path.relative_to(root).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path) -> list[tuple[str, int, bool]]:
  """(module imported, line, at top level) for every import statement of the file."""
  tree = ast.parse(path.read_text(), str(path))
  top = {id(node) for node in tree.body}
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found += [(alias.name, node.lineno, id(node) in top) for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      found += [(f"{node.module}.{alias.name}", node.lineno, id(node) in top) for alias in node.names]
  return [(name, line, at_top) for name, line, at_top in found if name.split(".")[0] in PACKAGES]


def _project_files():
  return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if "hardening" not in p.parts)


def _known(name: str, modules: set[str]) -> str:
  """The project module `name` refers to (`from a.b import c` names module a.b.c or attribute c of a.b)."""
  return name if name in modules else name.rsplit(".", 1)[0]


def _upward(files, root: pathlib.Path = ROOT) -> list[str]:
  found = []
  for path in files:
    here = _layer(_module_name(path, root))
    for name, line, _ in _imports(path):
      there = _layer(name)
      if here is not None and there is not None and there > here:
        found.append(f"{path.relative_to(root)}:{line} imports {name}")
  return found


def test_no_module_imports_a_higher_layer():
  upward = _upward(_project_files())
  assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_cycles_between_modules():
  files = {_module_name(p): p for p in _project_files()}
  graph = {m: {_known(name, set(files)) for name, _, at_top in _imports(p) if at_top} & set(files) - {m}
           for m, p in files.items()}
  graph = {m: {d for d in deps if not m.startswith(d + ".") and d != m} for m, deps in graph.items()}
  state, cycle = {}, []

  def visit(m, stack):
    state[m] = "open"
    for d in sorted(graph[m]):
      if state.get(d) == "open":
        cycle.extend(stack[stack.index(d):] + [d] if d in stack else [m, d])
        return True
      if d not in state and visit(d, stack + [d]):
        return True
    state[m] = "done"
    return False

  for m in sorted(graph):
    if m not in state and visit(m, [m]):
      break
  assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_walk_sees_upward_imports_also_inside_functions(tmp_path):
  files = {"leap_jax/rollout/x.py": "def f():\n  from leap_jax.train import batch\n",
           "kernels_eval/y.py": "import leap_jax.models\n",
           "leap_jax/train/z.py": "from configs import default\nfrom leap_jax.rollout import harness\n"}
  for name, text in files.items():
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(text)
  found = _upward(sorted(tmp_path.rglob("*.py")), tmp_path)
  assert found == ["kernels_eval/y.py:1 imports leap_jax.models", "leap_jax/rollout/x.py:2 imports leap_jax.train.batch",
                   "leap_jax/train/z.py:1 imports configs.default"]
