"""kernels_eval without workers: task parsing, rendering, code extraction, seeds, static checks, wire."""
import dataclasses
import math
import pathlib
import subprocess
import sys
import textwrap
import threading

import ml_dtypes
import numpy as np
import pytest

import kernels_eval as ke
from kernels_eval import backends
from kernels_eval import compare
from kernels_eval import skeleton
from kernels_eval import static_check
from kernels_eval import task as task_lib
from kernels_eval import trials
from kernels_eval import wire
from kernels_eval.hardening import pallas_cases

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

TWO_INPUT_TASK = '''"""Add."""
import jax
import jax.numpy as jnp

ID = "add_two"
LEVEL = 1
SPLIT = "eval"
FAMILY = "elementwise"
STATEMENT = "out = x + y."
DIMS = {"check": [{"M": 3, "N": 100}], "timing": {"M": 1024, "N": 4096}}
INPUTS = [
    {"name": "x", "shape": ["M", "N"], "dtype": "float16", "dist": {"kind": "normal"}},
    {"name": "y", "shape": ["M", "N"], "dtype": "float16", "dist": {"kind": "uniform", "low": -2, "high": 2}},
]


def reference(x, y):
  return x + y
'''


def _write(tmp_path, text, name="add_two", level=1):
  folder = tmp_path / f"level{level}"
  folder.mkdir(parents=True, exist_ok=True)
  (folder / f"{name}.py").write_text(text)
  return tmp_path


def test_import_and_load_tasks_do_not_import_jax():
  code = "import sys, kernels_eval; kernels_eval.load_tasks(); print('jax' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == "False"


def test_embedded_suite_parses_with_small_check_shapes():
  tasks = ke.load_tasks()
  assert len({t.id for t in tasks}) == len(tasks)
  for t in tasks:
    assert t.trusted and t.path.endswith(f"level{t.level}/{t.id}.py")
    assert "pallas" in t.solutions, t.id
    assert task_lib.task_sizes(t)["check_elements"] <= 1 << 16, t.id
    assert len(t.source_hash) == 64


def test_parse_fields_and_defaults(tmp_path):
  t = ke.load_tasks(_write(tmp_path, TWO_INPUT_TASK))[0]
  assert (t.id, t.level, t.split, t.family) == ("add_two", 1, "eval", "elementwise")
  assert t.input_names == ["x", "y"] and t.dim_names == ["M", "N"]
  assert t.inputs[1].concrete_shape({"M": 2, "N": 5}) == (2, 5)
  assert t.tolerance_for("float16") == {"atol": 1e-2, "rtol": 1e-2}
  assert t.reference_source.startswith("def reference(x, y):")
  assert not t.trusted and t.solutions == {} and t.skeleton == {}


@pytest.mark.parametrize("old,new,field", [
    ('ID = "add_two"\n', "", "ID: is missing"),
    ('"dtype": "float16", "dist": {"kind": "normal"}', '"dtype": "float64", "dist": {"kind": "normal"}',
     "INPUTS[0].dtype"),
    ('LEVEL = 1', 'LEVEL = 1 + 0', "LEVEL: must be a literal"),
    ('ID = "add_two"', 'ID = "other"', "ID: 'other' must equal the file stem"),
    ('{"M": 3, "N": 100}', '{"M": 4, "N": 128}', "DIMS.check: needs an entry"),
    ('{"M": 3, "N": 100}', '{"M": 3}', "DIMS.check[0]: must have the same keys"),
    ('import jax\n', 'import os\n', "line 2: only `import jax`"),
    ("def reference(x, y):", "def reference(y, x):", "reference: signature must be reference(x, y)"),
    ("  return x + y", "  return eval('x') + y", "reference: forbidden_builtin"),
    ('SPLIT = "eval"', 'SPLIT = "eval"\nprint(SPLIT)', "unexpected top-level statement"),
    ('"shape": ["M", "N"], "dtype": "float16", "dist": {"kind": "uniform"',
     '"shape": ["M", "K"], "dtype": "float16", "dist": {"kind": "uniform"', "INPUTS[1].shape: dim 'K'"),
])
def test_malformed_task_names_file_and_field(tmp_path, old, new, field):
  assert old in TWO_INPUT_TASK
  _write(tmp_path, TWO_INPUT_TASK.replace(old, new))
  with pytest.raises(task_lib.TaskFormatError) as err:
    ke.load_tasks(tmp_path)
  assert "add_two.py" in str(err.value) and field in str(err.value)


def test_level_folder_and_duplicate_ids(tmp_path):
  _write(tmp_path, TWO_INPUT_TASK, level=2)
  with pytest.raises(task_lib.TaskFormatError, match="LEVEL: 1 does not match the folder level2"):
    ke.load_tasks(tmp_path)
  with pytest.raises(task_lib.TaskFormatError, match="is not a directory"):
    ke.load_tasks(tmp_path / "missing")


def test_render_pallas_contract(tmp_path):
  t = ke.load_tasks(_write(tmp_path, TWO_INPUT_TASK))[0]
  text = ke.render_task(t, "pallas")
  for needle in ("out = x + y.", "def reference(x, y):", "def solution(x, y) -> jax.Array", "pallas_call",
                 "power-of-two", "precision=jax.lax.Precision.HIGHEST", "Do not pass `interpret=`",
                 "M=3, N=100", "M=1024, N=4096", "float16: atol=0.01", "```python"):
    assert needle in text, needle


def test_render_level0_includes_skeleton():
  level0 = [t for t in ke.load_tasks() if t.level == 0]
  text = ke.render_task(level0[0], "pallas")
  assert task_lib.SKELETON_MARKER in text and level0[0].skeleton["pallas"].strip() in text


LEVEL0 = [t for t in ke.load_tasks() if t.level == 0]


@pytest.mark.parametrize("task", LEVEL0, ids=lambda t: t.id)
def test_level0_answer_completes_the_skeleton(task):
  answer = skeleton.skeleton_answer(task, "pallas")
  assert "def solution" not in answer and not answer.startswith(" ")
  assert skeleton.fill_skeleton(task, "pallas", answer).strip() == task.solutions["pallas"].strip()
  assert skeleton.fill_skeleton(task, "pallas", task.solutions["pallas"]) == task.solutions["pallas"]
  assert "Reply with only the line(s)" in ke.render_task(task, "pallas")


def test_fill_skeleton_indents_and_rejects_bad_skeletons():
  task = LEVEL0[0]
  filled = skeleton.fill_skeleton(task, "pallas", "    a = x\n\n    out = a\n")
  lines = filled.splitlines()
  marker = next(line for line in task.skeleton["pallas"].splitlines() if task_lib.SKELETON_MARKER in line)
  indent = marker[:len(marker) - len(marker.lstrip())]
  i = lines.index(indent + "a = x")
  assert lines[i + 1:i + 3] == ["", indent + "out = a"]
  two_markers = dataclasses.replace(task, skeleton={"pallas": f"{task_lib.SKELETON_MARKER}\n{task_lib.SKELETON_MARKER}"})
  with pytest.raises(ValueError, match="exactly one line"):
    skeleton.fill_skeleton(two_markers, "pallas", "out = x")
  drifted = dataclasses.replace(task, solutions={"pallas": "def solution(x):\n  return x\n"})
  with pytest.raises(ValueError, match="does not complete its skeleton"):
    skeleton.skeleton_answer(drifted, "pallas")
  level1 = next(t for t in ke.load_tasks() if t.level == 1)
  assert skeleton.fill_skeleton(level1, "pallas", "out = x") == "out = x"  # no skeleton: taken as is


def test_cuda_prototype_and_contract(tmp_path):
  t = ke.load_tasks(_write(tmp_path, TWO_INPUT_TASK))[0]
  assert ke.cuda_prototype(t) == ('extern "C" void solution(const __half* x, const __half* y, __half* out, '
                                  'int M, int N, cudaStream_t stream);')
  assert ke.cuda_prototype(t) in ke.render_task(t, "cuda")
  with pytest.raises(ValueError, match="unknown language 'rust'"):
    ke.render_task(t, "rust")


@pytest.mark.parametrize("reply,lang,expected", [
    ("Here:\n```python\ndef solution(x):\n  return x\n```\n", "pallas", "def solution(x):\n  return x\n"),
    ("```python\nscratch = 1\n```\ntext\n```python\ndef solution(x): pass\n```\n```python\nprint(2)\n```", "pallas",
     "def solution(x): pass\n"),
    ("```\na = 1\n```\n```\nb = 2\n```", "pallas", "b = 2\n"),
    ("```cuda\n__global__ void k() {}\n```\n```cpp\nextern \"C\" void solution() {}\n```", "cuda",
     "extern \"C\" void solution() {}\n"),
    ("```python\ndef solution(x):\n  return x", "pallas", "def solution(x):\n  return x\n"),
    ("```cpp\nint solution;\n```\n```python\ndef solution(x): pass\n```", "cuda", "int solution;\n"),
])
def test_extract_code(reply, lang, expected):
  assert ke.extract_code(reply, lang) == expected


def test_extract_code_without_block_explains():
  with pytest.raises(ke.NoCodeBlock, match=r"no pallas code block in the reply \(found blocks tagged \['cuda'\]\)"):
    ke.extract_code("```cuda\nint x;\n```", "pallas")
  with pytest.raises(ke.NoCodeBlock, match="put the code the contract asks for in one fenced block"):
    ke.extract_code("just words", "pallas")
  t = ke.load_tasks()[0] if ke.load_tasks() else None
  if t is not None:
    r = ke.missing_code_result(t, "pallas", "no code", "r1")
    assert (r.status, r.stage, r.rejected_reason, r.feedback) == ("compile_error", "static", "no_code_block", "no code")


def test_hmac_seed_and_trial_inputs_are_reproducible(tmp_path):
  t = ke.load_tasks(_write(tmp_path, TWO_INPUT_TASK))[0]
  secret = b"k" * 32
  seed = trials.derive_seed(secret, t.source_hash, "req-1")
  assert seed == trials.derive_seed(secret, t.source_hash, "req-1")
  assert seed != trials.derive_seed(secret, t.source_hash, "req-2")
  assert seed != trials.derive_seed(b"j" * 32, t.source_hash, "req-1")
  a, b = trials.all_trials(t, seed), trials.all_trials(t, seed)
  assert len(a) == trials.NUM_TRIALS
  for ta, tb in zip(a, b):
    for xa, xb in zip(ta, tb):
      np.testing.assert_array_equal(xa, xb)
  assert a[0][0].shape == (3, 100) and a[0][0].dtype == np.float16
  assert not np.array_equal(a[0][0], a[1][0])
  assert float(a[0][1].min()) >= -2 and float(a[0][1].max()) <= 2
  means = [float(tr[0].astype(np.float32).mean()) for tr in a]
  assert max(means) - min(means) > 0.1  # mean drawn per trial
  with pytest.raises(ValueError, match="at least 16 bytes"):
    trials.derive_seed(b"short", t.source_hash, "r")


def test_static_check_accepts_idiomatic_pallas():
  src = pallas_cases.GOOD + textwrap.dedent("""
      import functools
      import math
      from jax.experimental.pallas import triton as plt

      SCALE = math.sqrt(2.0)
      F32 = jnp.float32
      kernel = functools.partial(_relu_kernel)

      @functools.partial(jax.jit, static_argnums=())
      def scale_fn(x, shape=(2, 2)):
        return plt.load
      """)
  assert static_check.check_pallas_candidate(src, ["x"]) is None


@pytest.mark.parametrize("src,reason", [
    ("from jax.experimental import io_callback\ndef solution(x): return x\n", "forbidden_import"),
    ("import jax\ndef solution(x): return jax.config.update('x', 1)\n", "forbidden_api"),
    ("import jax\ndef solution(x): return x._value\n", "private_access"),
    ("import functools\n@functools.lru_cache\ndef solution(x): return x\n", "decorator_at_import"),
    ("def solution(x, memo={}): return x\n", "mutable_global_state"),
    ("def mk():\n  return 1\nSTATE = mk()\ndef solution(x): return x\n", "code_at_import"),
    ("def solution(x):\n  global y\n  return x\n", "mutable_global_state"),
    ("from . import thing\ndef solution(x): return x\n", "forbidden_import"),
    ("import urllib.request\ndef solution(x): return x\n", "network_access"),
    ("class A: pass\ndef solution(x): return x\n", "forbidden_construct"),
    ("for i in range(3): pass\ndef solution(x): return x\n", "code_at_import"),
    ("def solution(x, y, z): return x\n", "bad_signature"),
    ("x = '__subclasses__'\ndef solution(x): return x\n", "dunder_access"),
])
def test_static_check_rejections(src, reason):
  problem = static_check.check_pallas_candidate(src, ["x"])
  assert problem is not None and problem.reason == reason, problem


def test_compare_catches_zeros_nans_and_shapes():
  ref = np.full((64,), 2e-5, np.float32)
  assert compare.compare(ref.copy(), ref, 1e-4, 1e-4).ok
  zeros = compare.compare(np.zeros_like(ref), ref, 1e-4, 1e-4)
  assert not zeros.ok and "relative L2" in zeros.message
  x = np.linspace(-1, 1, 10).astype(np.float32)
  bad = x.copy()
  bad[3] = np.nan
  c = compare.compare(bad, x, 1e-4, 1e-4)
  assert not c.ok and c.mismatch_count == 1 and c.first_mismatches[0]["index"] == [3]
  assert "shape" in compare.compare(x[:5], x, 1e-4, 1e-4).message
  assert "dtype" in compare.compare(x.astype(np.float16), x, 1e-4, 1e-4).message
  inf = np.array([np.inf, 1.0], np.float32)
  assert compare.compare(inf.copy(), inf, 1e-4, 1e-4).ok


def test_wire_round_trip_and_rejects_bad_arrays():
  arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(3, ml_dtypes.bfloat16), np.int32(7),
            np.zeros((0, 2), np.float16)]
  msgs, problem = wire.split_frames(wire.encode({"a": arrays, "s": "é", "f": math.inf}) + wire.encode([1]))
  assert problem is None and msgs[1] == [1]
  for got, want in zip(msgs[0]["a"], arrays):
    np.testing.assert_array_equal(got, want)
  assert msgs[0]["a"][1].dtype == ml_dtypes.bfloat16 and msgs[0]["f"] == math.inf
  with pytest.raises(wire.WireError, match="has 4 bytes"):
    wire.decode_payload(b'{"x": {"__ndarray__": ["float32", [2], "AAAAAA=="]}}')
  with pytest.raises(wire.WireError, match="not allowed"):
    wire.decode_payload(b'{"x": {"__ndarray__": ["object", [1], ""]}}')
  cut, problem = wire.split_frames(wire.encode([1])[:-1])
  assert cut == [] and "cut-off" in problem
  deep = b"[" * 5000 + b"]" * 5000
  kept, problem = wire.split_frames(wire.encode([2]) + len(deep).to_bytes(4, "big") + deep)
  assert kept == [[2]] and "RecursionError" in problem
  wide = b"[" + b"[]," * 20000 + b"[]]"
  assert "more than" in wire.split_frames(len(wide).to_bytes(4, "big") + wide)[1]
  with pytest.raises(wire.WireError, match="at most 32 sizes"):
    wire.decode_payload(b'{"x": {"__ndarray__": ["float32", [1180591620717411303424], ""]}}')
  kept, problem = wire.split_frames(wire.encode([3]) + b"\xff\xff\xff\xff")
  assert kept == [[3]] and "cap" in problem


def test_backend_registry():
  assert backends.get("pallas").runner == "kernels_eval.pallas.runner:run"
  assert backends.runners()["reference"] == "kernels_eval.reference_runner:run"
  with pytest.raises(ValueError, match="unknown language 'fortran'"):
    backends.get("fortran")
  with pytest.raises(ValueError, match="EvalRequest.stages='all'"):
    ke.EvalRequest(None, "", "pallas", stages="all")


STRUCTURE_HEAD = """
import functools
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

def _k(x_ref, o_ref):
  o_ref[...] = x_ref[...] * 2.0

def _call(x):
  return pl.pallas_call(_k, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
"""


@pytest.mark.parametrize("body,reason", [
    ("return _call(x)", None),
    ("return _call(_call(x))", None),
    ("return _call(jnp.pad(x, (0, 8)).astype(jnp.float32))[:16].reshape(4, 4)", None),
    ("return jax.jit(_call)(x)", None),
    ("return _call(x).reshape(4, 4).T", "output_not_from_kernel"),
    ("return _call(x) + 1.0", "output_not_from_kernel"),
    ("return _call(jnp.exp(x))", "compute_outside_kernel"),
    ("y = _call(x)\n  return _call(x * 0.0 + 1.0)", "decoy_kernel"),
    ("return x", "no_pallas_call"),
])
def test_jaxpr_structure_rules(body, reason):
  import jax  # pylint: disable=import-outside-toplevel
  from kernels_eval.pallas import runner  # pylint: disable=import-outside-toplevel
  from kernels_eval.pallas import structure  # pylint: disable=import-outside-toplevel
  fn = runner.load_candidate(STRUCTURE_HEAD + f"\ndef solution(x):\n  {body}\n")
  closed = jax.make_jaxpr(fn)(jax.ShapeDtypeStruct((16,), np.float32))
  problem = structure.check_jaxpr(closed)
  assert (problem[0] if problem else None) == reason, problem


def test_candidate_namespace_wraps_pallas_call_and_blocks_imports():
  from kernels_eval.pallas import runner  # pylint: disable=import-outside-toplevel
  fn = runner.load_candidate("import jax.experimental.pallas as pl\ndef solution(x):\n  return pl.pallas_call\n")
  assert fn(None).__qualname__ == "_pallas_call"
  with pytest.raises(ImportError, match="import of 'os' is not allowed"):
    runner.load_candidate("import os\ndef solution(x): return x\n")
  with pytest.raises(NameError, match="open"):
    runner.load_candidate("def solution(x): return x\nopen('f')\n")
  with pytest.raises(AttributeError, match="read-only"):
    runner.load_candidate("import jax\njax.numpy = None\ndef solution(x): return x\n")


@pytest.mark.parametrize("src,reason", [
    ("import jax\ndef solution(x): return jax.version.subprocess\n", "forbidden_api"),
    ("def solution(x):\n  g = (i for i in ())\n  return g.gi_frame.f_back.f_globals\n", "forbidden_api"),
])
def test_static_check_blocks_escape_chains(src, reason):
  assert static_check.check_pallas_candidate(src, ["x"]).reason == reason


def test_candidate_modules_lead_nowhere_outside_jax():
  from kernels_eval.pallas import runner  # pylint: disable=import-outside-toplevel
  get_jax = runner.load_candidate("import jax\ndef solution(x):\n  return jax\n")
  view = get_jax(None)
  assert view.numpy.linalg.norm is not None and view.lax.fori_loop is not None
  for chain in (("version",), ("interpreters",), ("numpy", "np"), ("lax", "_src")):
    obj = view
    with pytest.raises(AttributeError):
      for name in chain:
        obj = getattr(obj, name)


def test_static_checks_run_in_parallel_threads(monkeypatch):
  """Two requests' static checks (for CUDA: nvcc and the audit) overlap: each waits for the other."""
  barrier = threading.Barrier(2, timeout=60)
  pallas = backends.get("pallas")

  def check_after_the_other_arrives(task, source):
    barrier.wait()
    return pallas.static_check(task, source)

  monkeypatch.setitem(backends._registry, "pallas_barrier",
                      dataclasses.replace(pallas, lang="pallas_barrier", static_check=check_after_the_other_arrives))
  task = ke.load_tasks()[0]
  with ke.Evaluator(workers=1, secret=b"0123456789abcdef") as ev:
    results = ev.evaluate_many([ke.EvalRequest(task, task.solutions["pallas"] + f"# {i}\n", "pallas_barrier",
                                               "static", f"r{i}") for i in range(2)])
  assert [(r.status, r.stage, r.infra_error) for r in results] == [("not_run", "static", None)] * 2


def test_parse_python_is_safe_on_parallel_threads():
  """The evaluator parses on several threads; unlocked `ast.parse` on CPython 3.11 raises SystemError
  ("AST constructor recursion depth mismatch") when a finaliser switches threads mid-parse."""
  import concurrent.futures  # pylint: disable=import-outside-toplevel
  import gc  # pylint: disable=import-outside-toplevel
  import time  # pylint: disable=import-outside-toplevel
  from kernels_eval import static_check  # pylint: disable=import-outside-toplevel
  source = "\n".join(pathlib.Path(t.path).read_text() for t in ke.load_tasks()[:8])

  class Cycle:  # collected by the GC, whose finaliser yields the GIL
    def __init__(self):
      self.me = self

    def __del__(self):
      time.sleep(0)

  def parse(_):
    for _ in range(3):
      Cycle()
    try:
      static_check.parse_python(source)
      return None
    except SystemError as e:
      return str(e)

  old = gc.get_threshold()
  gc.set_threshold(50, 1, 1)
  try:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
      errors = [e for e in pool.map(parse, range(600)) if e]
  finally:
    gc.set_threshold(*old)
  assert not errors, errors[:3]
