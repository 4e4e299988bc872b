"""Level-0 scaffolds written by the harness (probe/scaffold.py): hand-checked against the suite's skeletons."""
import re

import pytest

import kernels_eval
from kernels_eval import task as task_lib
from probe import generator
from probe import scaffold


def _output_shape(task):
  first = task.inputs[0].concrete_shape(task.check_dims[0])
  return (first[0],) if task.family == "reduction" else first


@pytest.mark.parametrize("task", [t for t in kernels_eval.load_tasks() if t.level == 0], ids=lambda t: t.id)
def test_scaffold_equals_the_suite_skeleton(task):
  assert scaffold.skeleton(task, _output_shape(task)) == task.skeleton["pallas"]


def test_witness_is_the_reference_body():
  ref = 'def reference(x, y):\n  """Doc."""\n  z = x * 2.0\n  return jnp.maximum(z, y)\n'
  assert scaffold.witness(ref) == "z = x * 2.0\nout = jnp.maximum(z, y)\n"
  with pytest.raises(scaffold.NoScaffold, match="does not end in"):
    scaffold.witness("def reference(x):\n  y = x\n")
  with pytest.raises(scaffold.NoScaffold, match="returns before"):
    scaffold.witness("def reference(x):\n  if True:\n    return x\n  return -x\n")


def test_with_skeleton_replaces_and_parses():
  relu = next(t for t in kernels_eval.load_tasks() if t.id == "relu")
  bare = generator.strip_solutions(open(relu.path).read())
  with pytest.raises(task_lib.TaskFormatError, match="level 0 needs SKELETON"):
    task_lib.parse_task_source(bare, "relu.py")
  assert task_lib.parse_task_source(bare, "relu.py", require_skeleton=False).skeleton == {}
  text = scaffold.with_skeleton(bare, relu.skeleton["pallas"])
  assert task_lib.parse_task_source(text, "relu.py").skeleton == relu.skeleton
  again = scaffold.with_skeleton(text.replace("# >>> your code here <<<", "pass"), relu.skeleton["pallas"])
  assert again.count("SKELETON = ") == 1 and task_lib.parse_task_source(again, "relu.py").skeleton == relu.skeleton


def test_scaffold_names_follow_inputs_and_reject_other_shapes():
  add = next(t for t in kernels_eval.load_tasks() if t.id == "add")
  renamed = re.sub(r"\by(_ref)?\b", r"b\1", re.sub(r"\bx(_ref)?\b", r"a\1", add.skeleton["pallas"]))
  assert "a_ref, b_ref, o_ref" in renamed and "solution(a, b)" in renamed
  text = generator.strip_solutions(open(add.path).read()).replace('"name": "x"', '"name": "a"').replace(
      '"name": "y"', '"name": "b"').replace("def reference(x, y):\n  return x + y", "def reference(a, b):\n  return a + b")
  task = task_lib.parse_task_source(text, "add.py", require_skeleton=False)
  assert scaffold.skeleton(task, (100, 300)) == renamed
  clash = task_lib.parse_task_source(text.replace('"name": "b"', '"name": "m"').replace("(a, b)", "(a, m)").replace(
      "a + b", "a + m"), "add.py", require_skeleton=False)
  with pytest.raises(scaffold.NoScaffold, match=r"input name\(s\) \['m'\] clash"):
    scaffold.skeleton(clash, (100, 300))
  with pytest.raises(scaffold.NoScaffold, match=r"inputs a\['M', 'N'\], b\['M', 'N'\] -> output of shape \[100\]"):
    scaffold.skeleton(task, (100,))
