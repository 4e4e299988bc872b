"""Locating nvcc, the CUDA runtime and the target architecture.

Two toolchains are supported, chosen by `prefer` (or the `KERNELS_EVAL_NVCC` environment variable):

- `system`: a CUDA toolkit installed on the host (`$CUDA_HOME/bin/nvcc`, else `nvcc` on `PATH`).
- `pypi`: the `nvcc` of the `nvidia-cuda-nvcc` wheel (CUDA 13.0), with the crt headers, `nvvm`,
  `libcudart.so.13` and `<nv/target>` from the matching `nvidia-cuda-crt`, `nvidia-nvvm`,
  `nvidia-cuda-runtime` and `nvidia-cuda-cccl` wheels (all installed under `site-packages/nvidia/cu13`).
- `auto` (default): `system` when one is found, else `pypi`.

Kernels built with CUDA 13 need an NVIDIA driver >= 580 on the GPU host. On hosts whose driver only
supports CUDA 12, compile with a CUDA 12 system toolkit (`CUDA_HOME`), or compile at run time through
NVRTC (`nvidia-cuda-nvrtc-cu12`) to PTX, which the CUDA 12 driver JIT-compiles.

The architecture comes from the visible GPU (`nvidia-smi --query-gpu=compute_cap`, run once per process
tree: `visible_gpu_arch`), else from `KERNELS_EVAL_CUDA_ARCH` or the `default_arch` argument (`sm_90`, the
H100/H200 family).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess

NVCC_ENV = "KERNELS_EVAL_NVCC"
ARCH_ENV = "KERNELS_EVAL_CUDA_ARCH"
GPU_ARCHS_ENV = "KERNELS_EVAL_GPU_ARCHS"  # nvidia-smi's answer, kept for this process and its children
DEFAULT_ARCH = "sm_90"
PREFERENCES = ("auto", "system", "pypi")
CUDART_SONAME = "libcudart.so.13"  # of the wheel; a system toolkit uses libcudart.so.<its major version>


class ToolchainError(RuntimeError):
  """No usable nvcc was found for the requested preference."""


@dataclasses.dataclass(frozen=True)
class Toolchain:
  """One nvcc installation.

  origin: `system` or `pypi`.
  root: the toolkit folder holding `bin/nvcc`, `include/` and `lib/`.
  cudart_dir: folder holding the CUDA runtime shared library that kernels link against.
  version: nvcc's release line, e.g. `13.0.88`.
  cudart_soname: that library's soname, e.g. `libcudart.so.13`.
  """
  origin: str
  nvcc: str
  root: str
  cudart_dir: str
  version: str
  cudart_soname: str = CUDART_SONAME

  @property
  def fingerprint(self) -> str:
    """Hash that changes whenever a different compiler would be used (a compile-cache key part)."""
    return hashlib.sha256(f"{self.origin}|{self.nvcc}|{self.version}".encode()).hexdigest()[:16]

  def env(self, job_dir: str) -> dict[str, str]:
    """The whole environment nvcc runs with; nothing is inherited from the calling process.

    PATH: the toolkit's `bin`, then /usr/bin:/bin (the host compiler). HOME and TMPDIR: `job_dir`, the
    only writable folder. LANG=C (plain ASCII diagnostics). CUDA_HOME: the toolkit root.
    """
    return {"PATH": f"{pathlib.Path(self.nvcc).parent}:/usr/bin:/bin", "HOME": job_dir, "TMPDIR": job_dir,
            "LANG": "C", "CUDA_HOME": self.root}

  def describe(self) -> dict[str, str]:
    return {"nvcc": self.nvcc, "origin": self.origin, "nvcc_version": self.version}


def _nvcc_version(nvcc: str) -> str:
  out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60, check=False)
  match = re.search(r"V(\d+\.\d+\.\d+)", out.stdout)
  if out.returncode != 0 or not match:
    raise ToolchainError(f"{nvcc} --version failed: {out.stderr.strip() or out.stdout.strip()}")
  return match.group(1)


def _cudart_dir(root: pathlib.Path, soname: str) -> pathlib.Path | None:
  for sub in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
    if (root / sub / soname).exists():
      return root / sub
  return None


def _system_toolchain() -> Toolchain | None:
  candidates = []
  if os.environ.get("CUDA_HOME"):
    candidates.append(pathlib.Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc")
  on_path = shutil.which("nvcc")
  if on_path:
    candidates.append(pathlib.Path(on_path))
  candidates.append(pathlib.Path("/usr/local/cuda/bin/nvcc"))
  for nvcc in candidates:
    if not nvcc.exists():
      continue
    version = _nvcc_version(str(nvcc))
    root = nvcc.resolve().parent.parent
    soname = f"libcudart.so.{version.split('.')[0]}"
    cudart = _cudart_dir(root, soname)
    if cudart is None:  # e.g. a wrapper script outside the toolkit: try the next candidate
      continue
    return Toolchain("system", str(nvcc), str(root), str(cudart), version, soname)
  return None


def pypi_root() -> pathlib.Path | None:
  """The `nvidia/cu13` folder of the nvidia-cuda-nvcc wheel, or None when it is not installed."""
  spec = importlib.util.find_spec("nvidia")
  if spec is None or not spec.submodule_search_locations:
    return None
  for base in spec.submodule_search_locations:
    root = pathlib.Path(base) / "cu13"
    if (root / "bin" / "nvcc").exists():
      return root
  return None


def _pypi_toolchain() -> Toolchain | None:
  root = pypi_root()
  if root is None:
    return None
  missing = [p for p in ("include/crt/host_config.h", "include/cuda_runtime.h", "include/cccl/nv/target",
                         "nvvm/bin/cicc", f"lib/{CUDART_SONAME}") if not (root / p).exists()]
  if missing:
    raise ToolchainError(
        f"the nvidia-cuda-nvcc wheel at {root} lacks {missing}: install the matching nvidia-cuda-crt, "
        "nvidia-nvvm, nvidia-cuda-runtime and nvidia-cuda-cccl 13.0.x wheels (see requirements.txt)")
  nvcc = root / "bin" / "nvcc"
  return Toolchain("pypi", str(nvcc), str(root), str(root / "lib"), _nvcc_version(str(nvcc)))


def find_toolchain(prefer: str | None = None) -> Toolchain:
  """Returns the toolchain for `prefer` (`auto`, `system`, `pypi`; default from KERNELS_EVAL_NVCC)."""
  prefer = prefer or os.environ.get(NVCC_ENV) or "auto"
  if prefer not in PREFERENCES:
    raise ValueError(f"{NVCC_ENV}/prefer={prefer!r} is not one of {PREFERENCES}")
  return _find(prefer)


@functools.lru_cache(maxsize=None)
def _find(prefer: str) -> Toolchain:
  if prefer in ("auto", "system"):
    found = _system_toolchain()
    if found is not None:
      return found
    if prefer == "system":
      raise ToolchainError("no system CUDA toolkit: set CUDA_HOME or put nvcc on PATH")
  found = _pypi_toolchain()
  if found is None:
    raise ToolchainError("no nvcc found: install a CUDA toolkit or `pip install nvidia-cuda-nvcc==13.0.88`")
  return found


def _probe_gpu_archs() -> str:
  """`sm_XY` of every GPU nvidia-smi lists (all of the machine's, whatever CUDA_VISIBLE_DEVICES says),
  comma-separated, or "none"."""
  smi = shutil.which("nvidia-smi")
  if smi is None:
    return "none"
  try:
    out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=30, check=False)
  except (OSError, subprocess.TimeoutExpired):
    return "none"
  caps = [re.fullmatch(r"(\d+)\.(\d+)", ln.strip()) for ln in out.stdout.splitlines() if ln.strip()]
  if out.returncode != 0 or not caps or not all(caps):
    return "none"
  return ",".join(f"sm_{m.group(1)}{m.group(2)}" for m in caps)


def visible_gpu_arch() -> str | None:
  """`sm_XY` of the first visible GPU according to nvidia-smi, or None without one.

  nvidia-smi runs at most once per process tree: its answer is kept in the environment (GPU_ARCHS_ENV),
  which this process reads on later calls and the processes it starts inherit.
  """
  archs = os.environ.get(GPU_ARCHS_ENV)
  if archs is None:
    archs = os.environ[GPU_ARCHS_ENV] = _probe_gpu_archs()
  visible = os.environ.get("CUDA_VISIBLE_DEVICES")
  if archs == "none" or visible == "":
    return None
  listed = archs.split(",")
  first = (visible or "").split(",")[0]
  return listed[min(int(first), len(listed) - 1)] if first.isdigit() else listed[0]


def target_arch(default_arch: str | None = None) -> str:
  """The visible GPU's architecture, else KERNELS_EVAL_CUDA_ARCH, else `default_arch` (sm_90)."""
  arch = visible_gpu_arch() or os.environ.get(ARCH_ENV) or default_arch or DEFAULT_ARCH
  if not re.fullmatch(r"sm_\d{2,3}a?", arch):
    raise ValueError(f"CUDA architecture {arch!r} is not of the form sm_XY")
  return arch
