"""Architectures of public checkpoints as their HF config.json dicts (no weights): dry runs, random-weight
benchmarks and the shape check before loading a real checkpoint."""

# Qwen2.5-1.5B-Instruct.
QWEN25_1P5B = {
    "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960,
    "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2, "hidden_act": "silu",
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
    "tie_word_embeddings": True, "bos_token_id": 151643, "eos_token_id": 151645,
}
