"""Model configuration for LLaMA- and Qwen2-family decoders, read from a Hugging Face `config.json`."""
import dataclasses
import json
import os
from typing import Any, Mapping

import jax.numpy as jnp

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
REMAT_MODES = ("none", "full")
_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture and numerics of a decoder-only transformer.

  Frozen (hashable), so it can be a static argument of `jax.jit`.

  Attributes:
    model_type: "llama" or "qwen2".
    vocab_size: V.
    hidden_size: D, the residual-stream width.
    intermediate_size: F, the SwiGLU hidden width.
    num_layers: N.
    num_heads: H, query heads.
    num_kv_heads: K, key/value heads (H % K == 0; grouped-query attention).
    head_dim: d, per-head width.
    rms_norm_eps: epsilon inside RMSNorm.
    rope_theta: RoPE base frequency.
    rope_scaling: None, or the sorted items of the checkpoint's RoPE scaling dict (without theta).
    max_position_embeddings: longest context the checkpoint was trained for.
    qkv_bias: whether the q/k/v projections have biases (Qwen2, LLaMA with attention_bias).
    o_bias: whether the output projection has a bias (LLaMA with attention_bias).
    tie_word_embeddings: output layer computed from the embedding matrix.
    bos_token_id, eos_token_id, pad_token_id: special ids from the checkpoint (may be None).
    dtype: compute dtype name.
    param_dtype: parameter storage dtype name.
    scan_layers: stack layer params on a leading axis and run the layers with `lax.scan`.
    remat: "none" or "full" (recompute each layer's activations in the backward pass).
  """
  model_type: str
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_scaling: tuple[tuple[str, Any], ...] | None = None
  max_position_embeddings: int = 2048
  qkv_bias: bool = False
  o_bias: bool = False
  tie_word_embeddings: bool = False
  bos_token_id: int | None = None
  eos_token_id: int | tuple[int, ...] | None = None
  pad_token_id: int | None = None
  dtype: str = "float32"
  param_dtype: str = "float32"
  scan_layers: bool = True
  remat: str = "none"

  def __post_init__(self):
    if self.model_type not in SUPPORTED_MODEL_TYPES:
      raise ValueError(f"model_type {self.model_type!r} is not one of {SUPPORTED_MODEL_TYPES}")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim"):
      if getattr(self, name) <= 0:
        raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"{name} {getattr(self, name)!r} is not one of {_DTYPES}")
    if self.remat not in REMAT_MODES:
      raise ValueError(f"remat {self.remat!r} is not one of {REMAT_MODES}")
    rope_type = self.rope_scaling_dict.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
      raise ValueError(f"RoPE type {rope_type!r} is not one of {SUPPORTED_ROPE_TYPES}")

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  @property
  def weight_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.param_dtype)

  @property
  def rope_scaling_dict(self) -> dict[str, Any]:
    return dict(self.rope_scaling or ())

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_hf_config(cls, path_or_dict: str | os.PathLike | Mapping[str, Any], dtype: str = "float32",
                     param_dtype: str = "float32", scan_layers: bool = True,
                     remat: str = "none") -> "ModelConfig":
    """Builds a config from a HF `config.json` (a file, the folder holding it, or its parsed dict)."""
    hf = _read_hf_dict(path_or_dict)
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
      raise ValueError(f"HF model_type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
      raise ValueError(f"hidden_act {act!r} is not supported (only 'silu', SwiGLU)")
    if hf.get("mlp_bias", False):
      raise ValueError("mlp_bias=True is not supported")
    if hf.get("use_sliding_window", False):
      raise ValueError("use_sliding_window=True is not supported")
    num_heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
    rope = dict(hf.get("rope_parameters") or {})
    rope_theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
    if hf.get("rope_scaling"):
      rope.update(hf["rope_scaling"])
    if "type" in rope and "rope_type" not in rope:
      rope["rope_type"] = rope.pop("type")
    rope.pop("type", None)
    rope_scaling = None if rope.get("rope_type", "default") == "default" else tuple(sorted(rope.items()))
    attention_bias = hf.get("attention_bias", False)
    eos = hf.get("eos_token_id")
    return cls(
        model_type=model_type,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=head_dim,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope_theta),
        rope_scaling=rope_scaling,
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=model_type == "llama" and attention_bias,
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
        pad_token_id=hf.get("pad_token_id"),
        dtype=dtype,
        param_dtype=param_dtype,
        scan_layers=scan_layers,
        remat=remat,
    )

  def to_hf_config(self) -> dict[str, Any]:
    """The HF `config.json` dict describing this architecture (weights saved in `param_dtype`)."""
    if self.model_type == "qwen2" and self.o_bias:
      raise ValueError("Qwen2 has no output-projection bias")
    if self.model_type == "llama" and self.qkv_bias != self.o_bias:
      raise ValueError("LLaMA's attention_bias covers q/k/v and o together")
    rope = {"rope_type": "default", **self.rope_scaling_dict, "rope_theta": self.rope_theta}
    hf = {
        "architectures": ["LlamaForCausalLM" if self.model_type == "llama" else "Qwen2ForCausalLM"],
        "model_type": self.model_type,
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads,
        "head_dim": self.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": self.rms_norm_eps,
        "rope_theta": self.rope_theta,
        "rope_parameters": rope,
        "max_position_embeddings": self.max_position_embeddings,
        "tie_word_embeddings": self.tie_word_embeddings,
        "bos_token_id": self.bos_token_id,
        "eos_token_id": list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id,
        "pad_token_id": self.pad_token_id,
        "dtype": self.param_dtype,
    }
    if self.model_type == "llama":
      hf["attention_bias"] = self.qkv_bias
      hf["mlp_bias"] = False
    else:
      hf["use_sliding_window"] = False
    if self.rope_scaling is not None:
      hf["rope_scaling"] = dict(self.rope_scaling_dict)
    return hf


def _read_hf_dict(path_or_dict: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
  if isinstance(path_or_dict, Mapping):
    return dict(path_or_dict)
  path = os.fspath(path_or_dict)
  if os.path.isdir(path):
    path = os.path.join(path, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no HF config.json at {path}")
  with open(path) as f:
    return json.load(f)
