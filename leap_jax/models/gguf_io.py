"""Reading llama.cpp GGUF files (LLaMA architecture): config, dequantised weights and tokenizer.

llama.cpp's converter permutes the rows of the Q and K projections so that RoPE rotates adjacent
channel pairs; `unpermute_rows` restores the half-split layout this model (and HF) uses. Without it the
model still produces fluent-looking but wrong text.
"""
import os

import gguf
import numpy as np
from gguf.quants import dequantize
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from leap_jax.models.config import ModelConfig

_TOKEN_NORMAL, _TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_USER_DEFINED = 1, 2, 3, 4
_PER_LAYER = {
    "attn_norm.weight": "attn_norm.scale",
    "attn_q.weight": "attn.q_proj",
    "attn_k.weight": "attn.k_proj",
    "attn_v.weight": "attn.v_proj",
    "attn_output.weight": "attn.o_proj",
    "ffn_norm.weight": "mlp_norm.scale",
    "ffn_gate.weight": "mlp.gate_proj",
    "ffn_up.weight": "mlp.up_proj",
    "ffn_down.weight": "mlp.down_proj",
}


def unpermute_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
  """Inverse of llama.cpp's Q/K row permutation: [heads * d, in] -> [heads * d, in].

  Within each head, llama.cpp stores rows in the order (0, d/2, 1, d/2 + 1, ...); this puts them back
  as (0, 1, ..., d/2 - 1, d/2, ..., d - 1).
  """
  rows = w.shape[0]
  if rows % (2 * num_heads):
    raise ValueError(f"{rows} rows do not split into {num_heads} heads of even size")
  return w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader, key: str, default=None):
  field = reader.fields.get(key)
  return default if field is None else field.contents()


def _reader(path: str | os.PathLike) -> gguf.GGUFReader:
  return gguf.GGUFReader(os.fspath(path))


def gguf_config(reader, dtype: str = "float32", param_dtype: str = "float32", scan_layers: bool = True,
                remat: str = "none") -> ModelConfig:
  """ModelConfig from the GGUF metadata of a LLaMA-architecture file."""
  arch = _field(reader, "general.architecture")
  if arch != "llama":
    raise ValueError(f"GGUF architecture {arch!r} is not supported (only 'llama')")
  names = {t.name for t in reader.tensors}
  hidden = int(_field(reader, "llama.embedding_length"))
  heads = int(_field(reader, "llama.attention.head_count"))
  vocab = _field(reader, "llama.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
  return ModelConfig(
      model_type="llama",
      vocab_size=int(vocab),
      hidden_size=hidden,
      intermediate_size=int(_field(reader, "llama.feed_forward_length")),
      num_layers=int(_field(reader, "llama.block_count")),
      num_heads=heads,
      num_kv_heads=int(_field(reader, "llama.attention.head_count_kv", heads)),
      head_dim=int(_field(reader, "llama.rope.dimension_count", hidden // heads)),
      rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
      rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
      max_position_embeddings=int(_field(reader, "llama.context_length", 2048)),
      tie_word_embeddings="output.weight" not in names,
      bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
      eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
      pad_token_id=_field(reader, "tokenizer.ggml.padding_token_id"),
      dtype=dtype,
      param_dtype=param_dtype,
      scan_layers=scan_layers,
      remat=remat,
  )


def gguf_weights(reader, cfg: ModelConfig) -> dict[str, np.ndarray]:
  """Dequantised f32 weights in our flat per-layer names, Q/K rows un-permuted, kernels [in, out]."""
  flat = {}
  for tensor in reader.tensors:
    w = np.asarray(dequantize(tensor.data, tensor.tensor_type), np.float32)
    name = tensor.name
    if name == "token_embd.weight":
      flat["embedding"] = w
    elif name == "output_norm.weight":
      flat["final_norm.scale"] = w
    elif name == "output.weight":
      flat["lm_head"] = w.T
    elif name.startswith("blk."):
      _, layer, rest = name.split(".", 2)
      if rest not in _PER_LAYER:
        raise ValueError(f"GGUF tensor {name} has no counterpart in this model")
      if rest == "attn_q.weight":
        w = unpermute_rows(w, cfg.num_heads)
      elif rest == "attn_k.weight":
        w = unpermute_rows(w, cfg.num_kv_heads)
      flat[f"layers.{layer}.{_PER_LAYER[rest]}"] = w.T if w.ndim == 2 else w
    elif name != "rope_freqs.weight":
      raise ValueError(f"GGUF tensor {name} has no counterpart in this model")
  return flat


def _pre_tokenizer(pre: str | None):
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  # llama.cpp's "smollm" / "starcoder" pre-tokenizers split digits one by one before the GPT-2 regex.
  if pre in ("smollm", "starcoder", "refact"):
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
  if pre == "gpt-2":
    return byte_level
  raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported")


def gguf_tokenizer(reader):
  """HF fast tokenizer (byte-level BPE) with special tokens and chat template from GGUF metadata."""
  import transformers  # Imported on use: importing it takes seconds.
  model_kind = _field(reader, "tokenizer.ggml.model")
  if model_kind != "gpt2":
    raise ValueError(f"GGUF tokenizer model {model_kind!r} is not supported (only byte-level BPE 'gpt2')")
  tokens = _field(reader, "tokenizer.ggml.tokens")
  types = _field(reader, "tokenizer.ggml.token_type")
  merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
  tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
  tok.pre_tokenizer = _pre_tokenizer(_field(reader, "tokenizer.ggml.pre"))
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                          for i, t in enumerate(types) if t in (_TOKEN_UNKNOWN, _TOKEN_CONTROL)])
  tok.add_tokens([AddedToken(tokens[i], normalized=False)
                  for i, t in enumerate(types) if t == _TOKEN_USER_DEFINED])

  def token(key):
    i = _field(reader, key)
    return None if i is None else tokens[i]

  return transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, bos_token=token("tokenizer.ggml.bos_token_id"),
      eos_token=token("tokenizer.ggml.eos_token_id"), unk_token=token("tokenizer.ggml.unknown_token_id"),
      pad_token=token("tokenizer.ggml.padding_token_id"),
      chat_template=_field(reader, "tokenizer.chat_template"))


def read_gguf(path: str | os.PathLike, dtype: str = "float32", param_dtype: str = "float32",
              scan_layers: bool = True, remat: str = "none"):
  """(ModelConfig, flat f32 weights, tokenizer) from a GGUF file."""
  reader = _reader(path)
  cfg = gguf_config(reader, dtype=dtype, param_dtype=param_dtype, scan_layers=scan_layers, remat=remat)
  return cfg, gguf_weights(reader, cfg), gguf_tokenizer(reader)
