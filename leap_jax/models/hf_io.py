"""Reading and writing Hugging Face checkpoint folders (config.json + safetensors + tokenizer files).

HF stores linear weights as [out, in]; this model stores kernels as [in, out], so every projection is
transposed on the way in and out. Biases, norm scales and the [V, D] embedding keep their layout.
"""
import json
import os
import re

import jax
import numpy as np
from jax.sharding import Mesh

from leap_jax.models.config import ModelConfig
from leap_jax.models.params import expected_shapes, model_from_flat, model_to_flat
from leap_jax.models.transformer import Transformer

_GLOBAL = {
    "embedding": ("model.embed_tokens.weight", False),
    "final_norm.scale": ("model.norm.weight", False),
    "lm_head": ("lm_head.weight", True),
}
_PER_LAYER = {
    "attn.q_proj": ("self_attn.q_proj.weight", True),
    "attn.k_proj": ("self_attn.k_proj.weight", True),
    "attn.v_proj": ("self_attn.v_proj.weight", True),
    "attn.o_proj": ("self_attn.o_proj.weight", True),
    "attn.q_bias": ("self_attn.q_proj.bias", False),
    "attn.k_bias": ("self_attn.k_proj.bias", False),
    "attn.v_bias": ("self_attn.v_proj.bias", False),
    "attn.o_bias": ("self_attn.o_proj.bias", False),
    "attn_norm.scale": ("input_layernorm.weight", False),
    "mlp_norm.scale": ("post_attention_layernorm.weight", False),
    "mlp.gate_proj": ("mlp.gate_proj.weight", True),
    "mlp.up_proj": ("mlp.up_proj.weight", True),
    "mlp.down_proj": ("mlp.down_proj.weight", True),
}
_IGNORED_HF = re.compile(r".*rotary_emb\.inv_freq$")
_LAYER_NAME = re.compile(r"layers\.(\d+)\.(.+)")


def hf_name(name: str) -> tuple[str, bool]:
  """Our flat param name -> (HF tensor name, whether the tensor is transposed)."""
  if name in _GLOBAL:
    return _GLOBAL[name]
  match = _LAYER_NAME.fullmatch(name)
  if match is None or match.group(2) not in _PER_LAYER:
    raise ValueError(f"no HF name for param {name}")
  hf, transposed = _PER_LAYER[match.group(2)]
  return f"model.layers.{match.group(1)}.{hf}", transposed


def _hf_to_ours(cfg: ModelConfig) -> dict[str, tuple[str, bool]]:
  table = {}
  for name in expected_shapes(cfg):
    hf, transposed = hf_name(name)
    table[hf] = (name, transposed)
  return table


def _safetensor_files(path: str) -> list[str]:
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.isfile(index):
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
    return sorted({os.path.join(path, v) for v in weight_map.values()})
  single = os.path.join(path, "model.safetensors")
  if os.path.isfile(single):
    return [single]
  raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path}")


def read_hf_weights(path: str | os.PathLike, cfg: ModelConfig) -> dict[str, np.ndarray]:
  """Reads a HF folder's safetensors into our flat per-layer names (numpy, checkpoint dtype)."""
  path = os.fspath(path)
  table = _hf_to_ours(cfg)
  from safetensors import safe_open  # pylint: disable=import-outside-toplevel  (not needed to run a model)
  flat, unexpected = {}, []
  for file in _safetensor_files(path):
    with safe_open(file, framework="numpy") as f:
      for key in f.keys():
        if key not in table:
          if not (_IGNORED_HF.match(key) or (key == "lm_head.weight" and cfg.tie_word_embeddings)):
            unexpected.append(key)
          continue
        name, transposed = table[key]
        tensor = f.get_tensor(key)
        flat[name] = tensor.T if transposed else tensor
  if unexpected:
    raise ValueError(f"checkpoint {path} has tensors this architecture does not use: {unexpected[:8]}")
  return flat


def load_tokenizer(path: str | os.PathLike):
  """The tokenizer saved in a checkpoint folder.

  With a tokenizer.json, it is loaded exactly as stored (`PreTrainedTokenizerFast`, special tokens and
  chat template from tokenizer_config.json); transformers' `AutoTokenizer` would instead rebuild the
  model family's own tokenizer class from the vocabulary.
  """
  import transformers  # Imported on use: importing it takes seconds.
  path = os.fspath(path)
  if os.path.isfile(os.path.join(path, "tokenizer.json")):
    return transformers.PreTrainedTokenizerFast.from_pretrained(path)
  return transformers.AutoTokenizer.from_pretrained(path)


def load_hf_checkpoint(path: str | os.PathLike, dtype: str = "float32", param_dtype: str | None = None,
                       scan_layers: bool = True, remat: str = "none", mesh: Mesh | None = None
                       ) -> tuple[Transformer, object]:
  """Loads a local HF LLaMA/Qwen2 folder into (Transformer, tokenizer).

  Args:
    path: folder with config.json, model.safetensors (or a sharded index) and tokenizer files.
    dtype: compute dtype.
    param_dtype: parameter dtype (default: `dtype`).
    scan_layers, remat: as in `ModelConfig`.
    mesh: if given, params are placed on it following `partition_specs`.
  """
  path = os.fspath(path)
  cfg = ModelConfig.from_hf_config(path, dtype=dtype, param_dtype=param_dtype or dtype,
                                   scan_layers=scan_layers, remat=remat)
  model = model_from_flat(cfg, read_hf_weights(path, cfg), mesh=mesh)
  return model, load_tokenizer(path)


def save_hf_checkpoint(model: Transformer, tokenizer, path: str | os.PathLike,
                       max_shard_bytes: int = 4 << 30) -> None:
  """Writes `model` (+ `tokenizer` when not None) as a HF folder that transformers can load.

  Weights are saved in the model's param dtype, split into shards of at most `max_shard_bytes`
  (with a model.safetensors.index.json) when larger.
  """
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
  path = os.fspath(path)
  os.makedirs(path, exist_ok=True)
  cfg = model.config
  tensors = {}
  for name, value in model_to_flat(model).items():
    hf, transposed = hf_name(name)
    array = np.asarray(jax.device_get(value))
    tensors[hf] = np.ascontiguousarray(array.T if transposed else array)
  shards, current, size = [], {}, 0
  for key in sorted(tensors):
    if current and size + tensors[key].nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[key] = tensors[key]
    size += tensors[key].nbytes
  shards.append(current)
  metadata = {"format": "pt"}
  if len(shards) == 1:
    save_file(shards[0], os.path.join(path, "model.safetensors"), metadata=metadata)
  else:
    weight_map = {}
    for i, shard in enumerate(shards):
      file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      save_file(shard, os.path.join(path, file), metadata=metadata)
      weight_map.update({k: file for k in shard})
    index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))},
             "weight_map": weight_map}
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
      json.dump(index, f, indent=2)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(cfg.to_hf_config(), f, indent=2)
  if tokenizer is not None:
    tokenizer.save_pretrained(path)
