"""Policy models: a Flax NNX LLaMA/Qwen2 decoder, its KV cache, sharding rules and weight I/O."""
from leap_jax.models.config import ModelConfig
from leap_jax.models.params import expected_shapes, model_from_flat, model_to_flat
from leap_jax.models.sharding import batch_spec, cache_spec, make_mesh, partition_specs, shard_model
from leap_jax.models.transformer import ModelOutput, Transformer, init_cache
from leap_jax.models.hf_io import load_hf_checkpoint, read_hf_weights, save_hf_checkpoint
from leap_jax.models.pretrained import EMBEDDED, embedded_gguf_path, load_pretrained
