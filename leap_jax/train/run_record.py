"""The run record: what produced a workdir (config, code revision, package and evaluator versions, seeds)."""
from __future__ import annotations

import datetime
import importlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from typing import Any, Mapping, Optional


RECORD_NAME = "run_record.json"
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml-collections", "transformers",
            "tokenizers", "tensorboardX")
# (module, attribute) pairs naming the evaluator's versioned formats.
EVALUATOR_VERSIONS = (("kernels_eval.schema", "SCHEMA_VERSION"), ("kernels_eval.validate", "VERDICT_VERSION"))
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def git_revision(repo: str = _REPO_ROOT) -> dict[str, Any]:
  """{"commit": sha or None, "dirty": bool or None} of the source tree."""
  def run(*args):
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10, check=False)
  try:
    head = run("rev-parse", "HEAD")
    status = run("status", "--porcelain", "--untracked-files=no")
  except (OSError, subprocess.TimeoutExpired):
    return {"commit": None, "dirty": None}
  commit = head.stdout.strip() if head.returncode == 0 else None
  return {"commit": commit, "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}


def package_versions(names=PACKAGES) -> dict[str, Optional[str]]:
  versions = {}
  for name in names:
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      versions[name] = None
  return versions


def evaluator_versions() -> dict[str, Any]:
  out = {}
  for module, attr in EVALUATOR_VERSIONS:
    out[f"{module}.{attr}"] = getattr(importlib.import_module(module), attr)
  return out


def build_run_record(config: Any, seeds: Mapping[str, int]) -> dict[str, Any]:
  """The record as a JSON-able dict; `config` is the run's config as a mapping (e.g. `TrainConfig.to_dict()`)."""
  cfg = dict(config)
  return {
      "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "argv": list(sys.argv),
      "python": platform.python_version(),
      "platform": platform.platform(),
      "git": git_revision(),
      "packages": package_versions(),
      "evaluator": evaluator_versions(),
      "seeds": dict(seeds),
      "config": cfg,
  }


def write_run_record(workdir: str | os.PathLike, config: Any, seeds: Mapping[str, int]) -> str:
  """Writes `<workdir>/run_record.json` (a resumed run keeps the first record and adds `run_record.<n>.json`).

  Returns the path written.
  """
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, RECORD_NAME)
  n = 1
  while os.path.exists(path):
    path = os.path.join(workdir, f"run_record.{n}.json")
    n += 1
  with open(path, "w") as f:
    json.dump(build_run_record(config, seeds), f, indent=2, sort_keys=True, default=str)
  return path
