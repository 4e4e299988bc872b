"""Checkpoints: resume after SIGKILL, clean stop on SIGTERM, run record."""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from kernels_eval.schema import SCHEMA_VERSION
from leap_jax.train import run_record
from leap_jax.train.preemption import StopRequest
from tests import checkpoint_resume_script as script

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoint_resume_script.py")


def _run_script(workdir, *args):
  proc = subprocess.run([sys.executable, SCRIPT, "--workdir", str(workdir), "--steps", "4", "--every", "2", *args],
                        capture_output=True, text=True, timeout=240, env=os.environ.copy())
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  return proc.returncode, (json.loads(lines[-1]) if lines else None), proc.stderr


def test_stop_request_records_sigterm_and_restores_the_handler():
  before = signal.getsignal(signal.SIGTERM)
  with StopRequest() as stop:
    assert not stop.requested_anywhere()
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.requested and stop.requested_anywhere() and stop.received == signal.SIGTERM
  assert signal.getsignal(signal.SIGTERM) is before


def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path):
  """4 steps straight vs: SIGKILL after step 3 (last checkpoint: 2), a new process resumes from 2 and is
  stopped by SIGTERM after step 3 (checkpoint 3, exit 0), then a resume from 3 finishes step 4."""
  straight = script.run(str(tmp_path / "straight"), steps=4, every=2)
  assert straight["resumed_from"] is None and straight["step"] == 4

  workdir = tmp_path / "interrupted"
  rc, out, err = _run_script(workdir, "--sigkill_after", "3")
  assert rc == -signal.SIGKILL, err[-2000:]
  assert out is None
  assert sorted(os.listdir(workdir / "checkpoints")) == ["2"]

  rc, out, err = _run_script(workdir, "--sigterm_after", "3")
  assert rc == 0, err[-2000:]
  assert out["resumed_from"] == 2 and out["step"] == 3 and out["stopped_by_signal"]

  resumed = script.run(str(workdir), steps=4, every=2)
  assert resumed["resumed_from"] == 3 and resumed["step"] == 4
  assert resumed["sampler"] == straight["sampler"] == {"tasks_drawn": 4 * script.B}
  assert resumed["rng"] == straight["rng"]
  a = np.load(tmp_path / "straight" / "final_params.npz")
  b = np.load(workdir / "final_params.npz")
  assert sorted(a.files) == sorted(b.files) and a.files
  for name in a.files:
    np.testing.assert_allclose(b[name], a[name], rtol=1e-6, atol=1e-8, err_msg=name)
  assert not np.allclose(a[a.files[0]], np.asarray(script.setup()[1]["embedding"].value))  # training moved

  record = json.loads((workdir / "run_record.json").read_text())
  assert record["evaluator"]["kernels_eval.schema.SCHEMA_VERSION"] == SCHEMA_VERSION
  assert record["seeds"] == {"learner": 0, "model_init": 0}
  assert record["config"]["learner"]["mu"] == 2
  assert record["packages"]["jax"] == __import__("jax").__version__


def test_run_record_never_overwrites(tmp_path):
  first = run_record.write_run_record(tmp_path, {"a": 1}, {"seed": 3})
  second = run_record.write_run_record(tmp_path, {"a": 2}, {"seed": 3})
  assert os.path.basename(first) == "run_record.json" and os.path.basename(second) == "run_record.1.json"
  assert json.loads(open(first).read())["config"] == {"a": 1}
  assert set(json.loads(open(second).read())["git"]) == {"commit", "dirty"}


def test_checkpointer_rejects_bad_settings(tmp_path):
  from leap_jax.train.checkpoint import Checkpointer
  with pytest.raises(ValueError, match="every and keep"):
    Checkpointer(tmp_path, every=0, keep=1)


def test_sharded_state_round_trip(tmp_path):
  """A TrainState sharded over a 2x2x2 mesh restores with the same values and shardings."""
  import jax
  from flax import nnx

  from configs import common
  from leap_jax.models import ModelConfig, Transformer
  from leap_jax.models import sharding as model_sharding
  from leap_jax.train import learner as learner_lib
  from leap_jax.train import optim
  from leap_jax.train.checkpoint import Checkpointer

  graphdef, params = nnx.split(Transformer(ModelConfig.from_hf_config(script.TINY), rngs=nnx.Rngs(1)))
  mesh = model_sharding.make_mesh(2, 2, 2)
  specs = model_sharding.partition_specs(params, mesh)
  learner = learner_lib.Learner(learner_lib.model_logprob_fn(graphdef), optim.make_optimizer(optim.OptimConfig()),
                                learner_lib.LearnerConfig(), mesh=mesh)
  state = learner.init_state(params, seed=5, param_specs=specs)
  ckpt = Checkpointer(tmp_path, every=10, keep=1)
  assert ckpt.restore_latest(learner.abstract_state(params, specs)) is None
  assert not ckpt.save(3, state, {"cursor": 7}, common.checkpoint().to_dict())  # 3 is not a multiple of 10
  assert ckpt.save(3, state, {"cursor": 7}, common.checkpoint().to_dict(), force=True)
  ckpt.wait()
  restored = Checkpointer(tmp_path, every=10, keep=1).restore_latest(learner.abstract_state(params, specs))
  assert restored["step"] == 3 and restored["sampler"] == {"cursor": 7}
  assert restored["config"] == common.checkpoint().to_dict()
  assert jax.tree.structure(restored["state"]) == jax.tree.structure(state)
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored["state"])):
    assert a.sharding.is_equivalent_to(b.sharding, a.ndim)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  ckpt.close()
