"""Corpus builder: durable records, crash (SIGKILL) and resume equal to an uninterrupted run, labels, metadata.

The generator here is scripted (task files built from the seed, some valid, some duplicates, some broken) and so is
the solver (K seeded coin flips whose bias depends on the task's family); validity checks are the real ones. Run as
a script, this module builds a corpus in a child process so the test can kill it.
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from probe import corpus
from probe import generator

FAMILIES = ("elementwise", "activation", "pointwise", "scaling", "unary", "map")
TASK = '''"""Generated: {family}."""
import jax.numpy as jnp

ID = "gen_task"
LEVEL = 1
SPLIT = "train"
FAMILY = "{family}"
STATEMENT = "out = tanh(x) * 1.5 + x for a float32 matrix x (task {seed})."
DIMS = {{"check": [{{"M": 33, "N": 70}}], "timing": {{"M": 1024, "N": 1024}}}}
INPUTS = [{{"name": "x", "shape": ["M", "N"], "dtype": "float32", "dist": {{"kind": "normal"}}}}]


def reference(x):
  return jnp.tanh(x) * 1.5 + x
'''


class ScriptedSource:
  """Reply j depends only on seeds[j]: a valid task of one of six families, or a broken file."""

  def generate(self, seeds):
    out = []
    for s in seeds:
      rng = np.random.default_rng(s)
      if rng.random() < 0.25:
        out.append("Here is a task:\n```python\nID = 'broken'\nLEVEL = \n```")
      else:
        out.append("```python\n" + TASK.format(family=FAMILIES[rng.integers(len(FAMILIES))], seed=s) + "```")
    return out


class ScriptedSolver:
  """K seeded attempts; pass probability by family, so labels vary."""
  metadata = {"checkpoint": "scripted", "attempts": 8, "pass_definition": "seeded coin", "mode": "turn1"}

  def __init__(self, delay_s=0.0):
    self.delay_s = delay_s

  def attempts(self, task, seed, index):
    time.sleep(self.delay_s)
    p = (FAMILIES.index(task.family) + 0.5) / len(FAMILIES)
    return list(np.random.default_rng([seed, index]).random(8) < p)


def build(out_dir, cache_dir, n, delay_s=0.0, log=print):
  checker = generator.TaskChecker(cache_dir=cache_dir)
  return corpus.build_corpus(out_dir, source=ScriptedSource(), solver=ScriptedSolver(delay_s), checker=checker,
                             num_tasks=n, seed=7, band=(1, 3), batch_size=4, metadata={"generator": "scripted"},
                             log=log)


N = 16


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("corpus")
  records = build(root / "full", root / "vcache", N, log=lambda *_: None)
  return root, records


def test_records_and_labels(reference_run):
  root, records = reference_run
  assert [r.index for r in records] == list(range(N))
  reasons = {r.reason.split(":")[0] for r in records if not r.valid}
  assert {"parse", "duplicate"} <= reasons
  valid = [r for r in records if r.valid]
  assert len({r.family for r in valid}) == len(valid)  # a repeated family is a near-duplicate
  for r in valid:
    assert r.attempts == 8 and r.label == int(1 <= r.passes <= 3)
  for r in records:
    assert r.seed == corpus.task_seed(7, r.index)
  meta = corpus.read_meta(root / "full")
  assert meta["solver"]["checkpoint"] == "scripted" and meta["band"] == [1, 3] and meta["seed"] == 7
  with pytest.raises(ValueError, match="different metadata"):
    corpus.build_corpus(root / "full", source=ScriptedSource(), solver=ScriptedSolver(), checker=generator.TaskChecker(
        cache_dir=root / "vcache"), num_tasks=N, seed=8, log=lambda *_: None)


def test_sigkill_and_resume_match_uninterrupted_run(reference_run):
  root, full = reference_run
  out = root / "crashed"
  cmd = [sys.executable, __file__, str(out), str(root / "vcache"), str(N), "0.4"]
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
  child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  records_file = out / corpus.RECORDS
  deadline = time.time() + 120
  while time.time() < deadline:
    if records_file.is_file() and len(records_file.read_text().splitlines()) >= 4:
      break
    assert child.poll() is None, "the corpus child exited before it was killed"
    time.sleep(0.05)
  os.kill(child.pid, signal.SIGKILL)
  child.wait()
  partial = corpus.read_records(out)
  assert 4 <= len(partial) < N
  with open(records_file, "a") as f:
    f.write('{"index": 99, "torn')  # a crash in the middle of a write
  resumed = build(out, root / "vcache", N, log=lambda *_: None)
  assert [json.dumps(r.__dict__, sort_keys=True) for r in resumed] == [
      json.dumps(r.__dict__, sort_keys=True) for r in full]
  lines = records_file.read_text().splitlines()
  assert len(lines) == N and sorted(json.loads(x)["index"] for x in lines) == list(range(N))


def test_relabel_replays_the_same_tasks(reference_run):
  root, full = reference_run

  class NewSolver(ScriptedSolver):
    metadata = {**ScriptedSolver.metadata, "checkpoint": "scripted-v2"}

    def attempts(self, task, seed, index):
      return [True] * 8

  relabelled = corpus.build_corpus(root / "relabel", source=corpus.RecordedSource(full), solver=NewSolver(),
                                   checker=generator.TaskChecker(cache_dir=root / "vcache"), num_tasks=N, seed=7,
                                   log=lambda *_: None)
  assert [(r.text, r.valid, r.reason) for r in relabelled] == [(r.text, r.valid, r.reason) for r in full]
  assert all(r.passes == 8 and r.label == 0 for r in relabelled if r.valid)
  with pytest.raises(ValueError, match="no reply for seeds"):
    corpus.RecordedSource(full[:2]).generate([corpus.task_seed(7, 5)])


def test_summary(reference_run):
  _, records = reference_run
  s = corpus.corpus_summary(records)
  valid = [r for r in records if r.valid]
  assert s["tasks"] == N and s["valid"] == len(valid)
  assert s["frontier_utility"] == pytest.approx(sum(r.label for r in valid) / N)



def test_another_band_relabels_from_stored_passes(reference_run):
  _, records = reference_run
  wide = corpus.with_band(records, (1, 7))
  assert [(r.index, r.valid, r.passes) for r in wide] == [(r.index, r.valid, r.passes) for r in records]
  assert all(w.label == int(1 <= w.passes <= 7) for w in wide if w.valid)
  assert [w.label for w in wide if not w.valid] == [r.label for r in records if not r.valid]
  assert [r.label for r in corpus.with_band(records, (1, 3))] == [r.label for r in records]
  with pytest.raises(ValueError, match="band"):
    corpus.with_band(records, (3, 1))


if __name__ == "__main__":
  build(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
