"""Test-session setup: 8 fake CPU devices, JAX's persistent compilation cache, GPU tests on GPU hosts.

These must be in place before JAX initialises its backends, so this module sets the environment at
import time, before any test module imports jax. The CPU is the default backend everywhere (the same
numerics on every machine); where an NVIDIA device exists the CUDA backend is also loaded, so that tests
marked `gpu` run there (they ask for `jax.devices("gpu")` explicitly).
"""
import os
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
NVIDIA_DEVICE = os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")

os.environ.setdefault("JAX_PLATFORMS", "cpu,cuda" if NVIDIA_DEVICE else "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(REPO_ROOT / ".cache" / "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402  (after the environment above)
import pytest  # noqa: E402

jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])


def _has_gpu() -> bool:
  try:
    return bool(jax.devices("gpu"))
  except RuntimeError:
    return False


def pytest_collection_modifyitems(config, items):
  del config
  if _has_gpu():
    return
  skip_gpu = pytest.mark.skip(reason="not_run: no GPU")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def embedded_model():
  """The embedded SmolLM2-135M-Instruct `(model, tokenizer)`, loaded once per test session."""
  from leap_jax.models import load_pretrained
  return load_pretrained("smollm2-135m-instruct")
