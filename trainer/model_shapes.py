"""Shapes of real models that the benchmarks and the real-size check build with random weights (nothing downloaded):
one place for each, so a benchmark and the check it is compared with build the same model."""

QWEN3_06B = dict(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    attention_bias=False,
    hidden_act="silu",
)
"""Qwen/Qwen3-0.6B's config.json (the shape; the weights are random): scripts/real_size.py, benchmarks/vs_trl.py and
benchmarks/decode_step.py build it."""
