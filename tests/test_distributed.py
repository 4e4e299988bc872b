"""Two local processes with 4 CPU devices each run one sharded train step and agree on the result."""
import os
import socket
import subprocess
import sys

import numpy as np

from tests import distributed_worker_script as worker

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "distributed_worker_script.py")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_two_processes_agree_with_each_other_and_with_one_process(tmp_path):
  port = _free_port()
  procs = [subprocess.Popen([sys.executable, SCRIPT, "--process_id", str(i), "--num_processes", "2",
                             "--port", str(port), "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
  outputs = []
  for p in procs:
    try:
      outputs.append(p.communicate(timeout=240)[0])
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-3000:]
  first, second = (np.load(tmp_path / f"params_{i}.npz") for i in range(2))
  assert sorted(first.files) == sorted(second.files) and len(first.files) > 1
  for name in first.files:
    np.testing.assert_array_equal(first[name], second[name], err_msg=name)

  single = worker.train_one_step()  # this process: 8 devices, same 2x2x2 mesh, whole batch
  assert sorted(single) == sorted(first.files)
  for name in first.files:
    np.testing.assert_allclose(first[name], single[name], rtol=1e-5, atol=1e-6, err_msg=name)
