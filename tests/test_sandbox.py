"""Kernel-level isolation, tried as an attacker would: code that already escaped the Python checks.

The "escaped" language (`kernels_eval.hardening.escaped`) runs a candidate as plain Python in the job's
jail. These tests use it for what the hardening corpus cannot express as one verdict: processes that
must not outlive a job, jobs running side by side, a pool that must survive anything, a machine that
cannot isolate, the opt-out, a checkout in a private directory, and the user-namespace path.
"""
import collections
import json
import os
import pathlib
import shutil
import site
import subprocess
import sys
import time

import numpy as np
import pytest

import kernels_eval as ke
from kernels_eval import backends
from kernels_eval import compare
from kernels_eval import jail
from kernels_eval import pool as pool_lib
from kernels_eval import protocol
from kernels_eval import sandbox
from kernels_eval import task as task_lib
from kernels_eval import trials as trials_lib
from kernels_eval.hardening import escaped
from kernels_eval.hardening import pallas_cases

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
MARKER = "hardening-marker-secret"


@pytest.fixture(scope="module")
def task():
  return task_lib.parse_task_source(pallas_cases.TASK_SOURCE, "hardening_relu.py", trusted=True)


@pytest.fixture(scope="module")
def escaped_lang():
  """The "escaped" language, and a secret-looking variable in the parent's environment."""
  escaped.register()
  os.environ["SANDBOX_TEST_TOKEN"] = MARKER
  yield escaped.LANG
  os.environ.pop("SANDBOX_TEST_TOKEN")
  backends.unregister(escaped.LANG)


@pytest.fixture(scope="module")
def evaluator(escaped_lang):
  """One worker, so that every attack is followed by the next job on the same worker slot."""
  del escaped_lang
  with ke.Evaluator(workers=1, timeout_s=60.0, cache_size=0) as ev:
    yield ev


def _case(name):
  return next(c for c in escaped.CASES if c.name == f"escaped_{name}")


def _honest(evaluator, task, tag):
  r = evaluator.evaluate(ke.EvalRequest(task, pallas_cases.GOOD + f"\n# {tag}\n", "pallas", "correctness", tag))
  assert (r.status, r.infra_error) == ("correct", None), r.feedback
  return r.provenance.durations["total"]


def test_jail_view_identity_and_environment():
  script = ("id -u; test -w /tmp && echo tmp_writable; touch /usr/x 2>/dev/null || echo usr_read_only; "
            "grep -q 'Seccomp:.2' /proc/self/status && echo seccomp_filter; "
            "ls /; ls /proc | grep -c '^[0-9]'; cat /proc/net/dev | tail -n +3 | cut -d: -f1; env | sort")
  done = jail.run_command(["/bin/sh", "-c", script], cwd="/tmp", env={"PATH": "/usr/bin:/bin", "ONLY": "this"},
                          readable=[str(REPO_ROOT / "kernels_eval")], timeout_s=30, uid=1 << 30, gid=1 << 30)
  lines = done.stdout.split()
  assert done.returncode == 0, done.stderr
  if os.geteuid() == 0:
    assert lines[0] == str(1 << 30)
  assert "tmp_writable" in lines and "usr_read_only" in lines and "seccomp_filter" in lines
  assert "root" not in lines and "home" not in lines
  assert not (pathlib.Path("/usr/x").exists())
  assert "lo" in lines and "eth0" not in lines
  assert [ln for ln in lines if "=" in ln] == ["ONLY=this", "PATH=/usr/bin:/bin", "PWD=/tmp"]
  with pytest.raises(subprocess.TimeoutExpired):
    jail.run_command(["/bin/sleep", "30"], cwd="/tmp", env={}, timeout_s=0.5)


def test_processes_do_not_outlive_their_job(evaluator, task):
  source = '''
import os, time
if os.fork() == 0:
  os.setsid()
  if os.fork() == 0:
    os.execv("/bin/sleep", ["sleep", "61.25"])
  os._exit(0)
time.sleep(0.5)
raise RuntimeError("blocked? a daemon was left behind")
'''
  r = evaluator.evaluate(ke.EvalRequest(task, source, "escaped", "correctness", "orphan"))
  assert r.status == "runtime_error" and r.infra_error is None

  def daemons():
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
      try:
        if pathlib.Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x0061.25\x00":
          found.append(pid)
      except OSError:
        continue
    return found
  deadline = time.monotonic() + 5
  while daemons() and time.monotonic() < deadline:
    time.sleep(0.1)
  assert daemons() == []
  _honest(evaluator, task, "after-orphan")


def test_side_by_side_jobs_cannot_see_or_signal_each_other(escaped_lang, task):
  victim = '''
import os, time
open(os.path.join(tmpdir, "victim_secret"), "w").write("s")
time.sleep(4)
pay()
'''
  attacker = '''
import os, signal, time
time.sleep(1)
found = []
for top in ("/tmp", "/dev/shm"):
  for d, _, fs in os.walk(top):
    found += [f for f in fs if f == "victim_secret"]
for pid in range(2, 40000):
  try:
    os.kill(pid, signal.SIGKILL)
  except OSError:
    pass
if found: pay()
raise RuntimeError("blocked")
'''
  with ke.Evaluator(workers=2, timeout_s=60.0, cache_size=0) as ev:
    v, a = ev.evaluate_many([ke.EvalRequest(task, victim, escaped_lang, "correctness", "victim"),
                             ke.EvalRequest(task, attacker, escaped_lang, "correctness", "attacker")])
  assert v.status == "correct", v.feedback
  assert a.status == "runtime_error" and "blocked" in a.feedback, a.feedback


@pytest.mark.parametrize("name", ["deep_directory_tree", "deep_frame", "huge_frame_header", "output_flood",
                                  "garbage_bytes", "fork_bomb", "exit_quietly"])
def test_pool_survives_and_the_next_honest_job_is_correct(evaluator, task, name):
  case = _case(name)
  r = evaluator.evaluate(ke.EvalRequest(task, case.source, "escaped", "correctness", name))
  assert (r.status, r.rejected_reason, r.infra_error) == (case.status, case.reason, None), r.feedback
  seconds = _honest(evaluator, task, f"after-{name}")
  print(f"{name}: the next honest job took {seconds:.2f} s")


def test_a_killed_worker_costs_one_infra_error(evaluator, task):
  sleeper = "import os, time\nif os.fork() == 0:\n  time.sleep(60)\ntime.sleep(30)\nraise RuntimeError('blocked')\n"
  future = evaluator.submit(ke.EvalRequest(task, sleeper, "escaped", "correctness", "sleeper"))
  deadline = time.monotonic() + 20
  while not evaluator.pool._all and time.monotonic() < deadline:  # pylint: disable=protected-access
    time.sleep(0.05)
  time.sleep(1.0)
  for worker in list(evaluator.pool._all):  # pylint: disable=protected-access
    os.kill(worker.proc.pid, 9)
  r = future.result(timeout=90)
  assert r.infra_error and "worker" in r.infra_error
  if os.geteuid() == 0:  # the killed worker's job died with it (its processes run as the pool's uids)
    deadline = time.monotonic() + 5
    while _processes_of(range(evaluator.pool.uid_base, evaluator.pool.uid_base + 256)) and time.monotonic() < deadline:
      time.sleep(0.1)
    assert _processes_of(range(evaluator.pool.uid_base, evaluator.pool.uid_base + 256)) == []
  _honest(evaluator, task, "after-worker-kill")


def _processes_of(uids) -> list[str]:
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
      continue
    uid = int(status.split("Uid:")[1].split()[0])
    if uid in uids:
      found.append(pid)
  return found


def test_no_isolation_means_no_untrusted_code(monkeypatch):
  monkeypatch.setattr(jail, "probe", lambda: "could not set up the job jail: no namespaces here")
  with pytest.raises(jail.IsolationUnavailable, match="isolation='process'"):
    pool_lib.WorkerPool(backends.runners(), workers=1)


def _others_can_read(path: str) -> bool:
  parts = pathlib.Path(path).resolve().parts
  return all(os.stat(os.path.join(*parts[:i + 1])).st_mode & 0o005 == 0o005 for i in range(1, len(parts)))


def test_process_isolation_is_an_explicit_opt_out(escaped_lang, task):
  """Without namespaces, root's jobs run as another uid on the host's files: that works where the
  interpreter is world-readable, and is refused with the path to fix where it is not (a 0700 home)."""
  limits = sandbox.Limits(isolation="process")
  if os.geteuid() == 0 and not _others_can_read(sys.base_prefix):
    with pytest.raises(jail.IsolationUnavailable, match=f"cannot read {sys.base_prefix}"):
      ke.Evaluator(workers=1, limits=limits)
    return
  with ke.Evaluator(workers=1, limits=limits, cache_size=0) as ev:
    secret = ev.evaluate(ke.EvalRequest(task, _case("read_parent_secret").source, escaped_lang, "correctness", "s"))
    good = ev.evaluate(ke.EvalRequest(task, pallas_cases.GOOD, "pallas", "correctness", "g"))
  assert secret.status == "runtime_error" and "blocked" in secret.feedback, secret.feedback
  assert good.status == "correct", good.feedback


def test_limits_are_checked():
  with pytest.raises(ValueError, match="isolation"):
    sandbox.Limits(isolation="none")
  with pytest.raises(ValueError, match="unprivileged"):
    sandbox.Limits(uid=0)


def _private_checkout(root: pathlib.Path) -> tuple[str, pathlib.Path]:
  """A copy of the package and a virtualenv (reusing this one's packages), both inside a 0700 folder."""
  os.chmod(root, 0o700)
  checkout = root / "checkout"
  shutil.copytree(REPO_ROOT / "kernels_eval", checkout / "kernels_eval",
                  ignore=shutil.ignore_patterns("__pycache__"))
  venv = root / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  site_dir = next(venv.glob("lib/python*/site-packages"))
  (site_dir / "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")
  return str(venv / "bin" / "python"), checkout


def _run_job(pool, task, source):
  seed = 7
  inputs = trials_lib.all_trials(task, seed)
  payload = {"task": task.to_job(), "source": source, "stages": "correctness", "trials": inputs,
             "trial_dims": [task.check_dims[t % len(task.check_dims)] for t in range(len(inputs))],
             "input_dtypes": [i.dtype for i in task.inputs]}
  outcome = pool.submit(["reference", "pallas"], payload, 120).result()
  expect = protocol.Expect(len(inputs), "correctness", False)
  return (protocol.read_reference(outcome.steps["reference"].messages, expect),
          protocol.read_candidate(outcome.steps["pallas"].messages, expect))


def test_a_checkout_in_a_private_directory_works(tmp_path, task):
  python, checkout = _private_checkout(tmp_path)
  with pool_lib.WorkerPool(backends.runners(), workers=1, python=python, package_root=checkout) as pool:
    ref, cand = _run_job(pool, task, pallas_cases.GOOD)
  assert ref.error is None and cand.violation is None and cand.ended_by == "done", (ref.error, cand)
  assert all(compare.compare(o, r, 1e-5, 1e-5).ok for o, r in zip(cand.outputs, ref.outputs))


@pytest.mark.skipif(os.geteuid() != 0, reason="the jobs' uid differs from the owner only when run as root")
def test_an_unreadable_file_is_reported_when_the_pool_starts(tmp_path):
  python, checkout = _private_checkout(tmp_path)
  hidden = checkout / "kernels_eval" / "compare.py"
  os.chmod(hidden, 0o600)
  with pool_lib.WorkerPool(backends.runners(), workers=1, python=python, package_root=checkout) as pool:
    with pytest.raises(jail.IsolationUnavailable, match=f"cannot read {hidden}"):
      pool.warm_up()
    with pytest.raises(jail.IsolationUnavailable):
      pool.submit(["reference"], {}, 10)


@pytest.mark.skipif(os.geteuid() != 0, reason="the jobs' uid differs from the owner only when run as root")
def test_an_unreadable_compile_cache_is_reported_when_the_pool_starts(tmp_path, monkeypatch):
  cache = tmp_path / "private_cache"
  cache.mkdir(mode=0o700)
  monkeypatch.setenv("KERNELS_EVAL_CACHE_DIR", str(cache))
  with pool_lib.WorkerPool(backends.runners(), workers=1) as pool:
    with pytest.raises(jail.IsolationUnavailable, match=f"cannot read {cache} .*KERNELS_EVAL_CACHE_DIR"):
      pool.warm_up()


USER_NAMESPACE_SCRIPT = """
import json, os
import kernels_eval as ke
from kernels_eval import sandbox
from kernels_eval import task as task_lib
from kernels_eval.hardening import escaped
escaped.register()
task = task_lib.parse_task_source(escaped.pallas_cases.TASK_SOURCE, "hardening_relu.py", trusted=True)
names = {names!r}
cases = [c for c in escaped.CASES if c.name in names]
with ke.Evaluator(workers=1, timeout_s=60) as ev:
  got = ev.evaluate_many([ke.EvalRequest(task, c.source, "escaped", "correctness", c.name) for c in cases])
  good = ev.evaluate(ke.EvalRequest(task, escaped.pallas_cases.GOOD, "pallas", "correctness", "good"))
with ke.Evaluator(workers=1, limits=sandbox.Limits(isolation="process")) as ev:
  process = ev.evaluate(ke.EvalRequest(task, escaped.pallas_cases.GOOD, "pallas", "correctness", "process"))
print(json.dumps({{"uid": os.getuid(), "ok": [c.name for c, r in zip(cases, got)
                                              if r.status == c.status and "blocked" in r.feedback],
                  "honest": good.status, "process": process.status}}))
"""


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
def test_user_namespace_jails_for_non_root_users():
  """The whole evaluator run by uid 1000 of a user namespace: jobs are jailed through their own user
  namespace (the path every non-root user takes), and the process opt-out runs jobs as that user. Fork
  bombs are left out: the outer namespace maps uid 1000 to root, which the kernel exempts from
  RLIMIT_NPROC."""
  names = [f"escaped_{n}" for n in ("write_outside_job_dir", "read_host_files", "see_host_processes", "become_root",
                                    "remount_read_write", "new_user_namespace", "read_parent_secret")]
  cmd = ["unshare", "--user", "--map-user=1000", "--map-group=1000", sys.executable, "-c",
         USER_NAMESPACE_SCRIPT.format(names=names)]
  done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT, check=False)
  if done.returncode != 0 and "unshare failed" in done.stderr:
    pytest.skip(f"user namespaces are not available here: {done.stderr.strip()[-200:]}")
  assert done.returncode == 0, done.stderr[-3000:]
  report = json.loads(done.stdout.strip().splitlines()[-1])
  assert report["uid"] == 1000 and report["honest"] == "correct" and report["process"] == "correct"
  assert sorted(report["ok"]) == sorted(names)


def test_trace_once_state_across_traces_gains_nothing(task):
  """A candidate whose later traces differ from its first (the static check would refuse the state it
  needs; here it is called directly): what the first trace checked is what runs."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from kernels_eval.pallas import runner  # pylint: disable=import-outside-toplevel
  kernel = runner.load_candidate(pallas_cases.GOOD)
  traces = collections.Counter()

  def kernel_then_jnp(x):
    traces[x.shape] += 1
    return kernel(x) if traces[x.shape] == 1 else jnp.maximum(x, 0.0) + 1.0
  frames = []
  inputs = trials_lib.all_trials(task, 3)
  traced = runner.trace_and_check(kernel_then_jnp, inputs, "", frames.append)
  assert traced is not None and frames == []
  assert runner._correctness(traced, inputs, False, "", frames.append)  # pylint: disable=protected-access
  for msg, trial in zip(frames, inputs):
    np.testing.assert_allclose(msg["output"], np.maximum(trial[0], 0.0))
  assert set(traces.values()) == {1}
  traces.clear()

  def jnp_then_kernel(x):
    traces[x.shape] += 1
    return jnp.maximum(x, 0.0) if traces[x.shape] == 1 else kernel(x)
  assert runner.trace_and_check(jnp_then_kernel, inputs, "", frames.append) is None
  assert frames[-1]["rejected_reason"] == "no_pallas_call"


def test_timed_calls_get_fresh_inputs_and_cannot_see_earlier_outputs():
  """A kernel that marks its inputs, or looks for an earlier output, finds nothing: every timed call runs
  on fresh copies of its set, and every output stays alive until the end."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from kernels_eval import timing  # pylint: disable=import-outside-toplevel
  seen_inputs, seen_outputs = [], []

  def fn(x):
    seen_inputs.append((x.unsafe_buffer_pointer(), float(x[0])))
    out = x + 1.0
    seen_outputs.append(out.unsafe_buffer_pointer())
    return out
  sets = [[jnp.full((1024,), float(k))] for k in range(3)]
  measured = timing.measure(fn, sets, rounds=3, calls=3, warmup=1)
  assert len(measured.samples) == 3 and min(measured.samples) >= timing.RESOLUTION_MS
  assert measured.ms == sorted(measured.samples)[1]
  # The first call sizes the outputs, one warm-up, then each round's timed calls end on set 0.
  assert [v for _, v in seen_inputs] == [0.0, 0.0] + [2.0, 1.0, 0.0] * 3
  assert float(measured.output[0]) == 1.0
  originals = {s[0].unsafe_buffer_pointer() for s in sets}
  timed_outputs = seen_outputs[2:]
  assert not originals & {p for p, _ in seen_inputs} and len(set(timed_outputs)) == 9


def test_remove_tree_takes_trees_deeper_than_path_max(tmp_path):
  """The "process" opt-out removes each job's host temp dir, whatever the job left in it."""
  top = tmp_path / "job"
  top.mkdir()
  fd = os.open(top, os.O_RDONLY)
  for _ in range(3000):  # 6000 characters below `top`: deeper than PATH_MAX and the recursion limit
    os.mkdir("d", dir_fd=fd)
    child = os.open("d", os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = child
  os.close(fd)
  sandbox.remove_tree(str(top))
  assert not top.exists()
