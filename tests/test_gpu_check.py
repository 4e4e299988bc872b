"""`launch/gpu_check.py --dry-run`: every section's code path on tiny shapes, with the packages that the GPU
image lacks (or that the check must not need) unimportable."""
import json
import os
import pathlib
import subprocess
import sys

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
BLOCKED = ("ml_collections", "orbax", "ray", "tensorboardX", "gguf", "transformers", "tokenizers", "safetensors",
           "tqdm", "matplotlib")
DRIVER = """
import importlib.abc, runpy, sys

class Block(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in {blocked!r}:
      raise ImportError(f"{{name}} is blocked in this test")
    return None

sys.meta_path.insert(0, Block())
sys.argv = ["gpu_check.py", "--dry-run", "--out", {out!r}, "--budget-s", "400"]
sys.exit(runpy.run_path("launch/gpu_check.py", run_name="__main__"))
"""


def test_dry_run_covers_every_section_without_the_missing_packages(tmp_path):
  out = tmp_path / "out"
  env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
  proc = subprocess.run([sys.executable, "-c", DRIVER.format(blocked=BLOCKED, out=str(out))], cwd=REPO_ROOT,
                        env=env, capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  report = json.loads((out / "gpu_check.json").read_text())
  assert report["dry_run"] and set(report["sections"]) == {"evaluator", "kernelbench", "sampler", "learner"}
  ev = report["sections"]["evaluator"]
  assert not any("error" in v for v in report["sections"].values()), proc.stdout[-3000:]
  pallas = [r for r in ev["suite"]["rows"] if r["lang"] == "pallas"]
  assert pallas and all(r["status"] == "correct" and r["kernel_ms"] and r["reference_ms"] for r in pallas)
  assert all(r["status"] == "not_run" for r in ev["suite"]["rows"] if r["lang"] == "cuda")
  assert ev["scaling"]["workers_1"]["finished"] == ev["scaling"]["jobs"] and ev["scaling"]["timing_spread"]
  assert ev["bandwidth"] and ev["hardening"]["caught"] == ev["hardening"]["total"] > 0
  assert "timing" in ev["suite"]["mean_s_per_job"]
  kb = report["sections"]["kernelbench"]
  assert not kb["skipped"] and len(kb["results"]) == 6 and all(r["status"] == "correct" for r in kb["results"])
  assert kb["per_level"]["1"]["problems"] == 5 and kb["per_level"]["1"]["timed"] == 0  # nothing timed on CPU
  assert [r["status"] for r in kb["cuda"]["results"]] == ["not_run"] * 6 and kb["cuda"]["per_level"]["2"]["timed"] == 0
  for name in ("sampler", "learner"):
    assert report["sections"][name]["status"] == "dry_run", report["sections"][name]
  assert (out / "gpu_sampler.json").exists() and (out / "gpu_learner.json").exists()
