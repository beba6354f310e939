"""Llama presets, each with the published parameter count of the shape it copies
(`PUBLISHED_PARAMS`; `tests/models/llama_presets_test.py` checks `count_params` within 1 %).

* `llama_tiny`: tests and toy runs (2 layers, 4 heads over 2 key/value heads, tied).
* `llama_150m`: SmolLM-135M's shape (HuggingFaceTB/SmolLM-135M config.json: 30 layers, 576
  hidden, 1536 mlp, 9 heads, 3 kv heads, head_dim 64, vocab 49152, tied, rope theta 10000,
  RMS eps 1e-5), published as 135M.
* `llama_1b`: Llama 3.2 1B (16 layers, 2048 hidden, 8192 mlp, 32 heads, 8 kv heads, head_dim 64,
  vocab 128256, tied, rope theta 500000 with llama3 scaling factor 32, low 1, high 4, original
  8192 positions), published as 1.24B.
* `llama_7b`: Llama-2-7B (32 layers, 4096 hidden, 11008 mlp, 32 heads, no GQA, head_dim 128,
  vocab 32000, untied, rope theta 10000, RMS eps 1e-5), published as 6.74B.
* `mixtral_tiny`: tests and toy runs of the mixture of experts (2 layers, 4 experts of which
  each token uses 2, untied, rope theta 1e6).
* `mixtral_8x7b`: Mixtral-8x7B-v0.1 (mistralai/Mixtral-8x7B-v0.1 config.json: 32 layers, 4096
  hidden, 14336 mlp per expert, 32 heads, 8 kv heads, head_dim 128, vocab 32000, untied, rope
  theta 1e6, RMS eps 1e-5, 8 experts, top 2, every layer routed), published as 46.7B in all
  and 12.9B active (`PUBLISHED_ACTIVE_PARAMS`, `count_params(..., active=True)`). Dropless, as
  transformers runs it (no token is dropped for capacity).

The presets of 32,000 words or more (all but the two toys) train with the chunked loss
(`loss_chunk_size=transformer_config.PRESET_LOSS_CHUNK_SIZE`).
"""

from __future__ import annotations

from cairn.models.llama.config import LlamaConfig
from cairn.models.moe_config import MoeConfig
from cairn.models.transformer_config import PRESET_LOSS_CHUNK_SIZE

LLAMA_3_2_ROPE_SCALING = {
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

PRESETS: dict[str, LlamaConfig] = {
    "llama_tiny": LlamaConfig(
        vocab_size=256, emb_dim=64, num_heads=4, num_kv_heads=2, head_dim=16, mlp_dim=128, num_layers=2
    ),
    "llama_150m": LlamaConfig(
        vocab_size=49152,
        emb_dim=576,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        mlp_dim=1536,
        num_layers=30,
        loss_chunk_size=PRESET_LOSS_CHUNK_SIZE,
    ),
    "llama_1b": LlamaConfig(
        vocab_size=128256,
        emb_dim=2048,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        mlp_dim=8192,
        num_layers=16,
        rope_theta=500000.0,
        rope_scaling=LLAMA_3_2_ROPE_SCALING,
        tie_word_embeddings=True,
        loss_chunk_size=PRESET_LOSS_CHUNK_SIZE,
    ),
    "llama_7b": LlamaConfig(
        vocab_size=32000,
        emb_dim=4096,
        num_heads=32,
        num_kv_heads=32,
        head_dim=128,
        mlp_dim=11008,
        num_layers=32,
        tie_word_embeddings=False,
        loss_chunk_size=PRESET_LOSS_CHUNK_SIZE,
    ),
    "mixtral_tiny": LlamaConfig(
        vocab_size=256,
        emb_dim=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        mlp_dim=128,
        num_layers=2,
        rope_theta=1e6,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        moe=MoeConfig(num_experts=4, top_k=2),
    ),
    "mixtral_8x7b": LlamaConfig(
        vocab_size=32000,
        emb_dim=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=14336,
        num_layers=32,
        rope_theta=1e6,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        moe=MoeConfig(num_experts=8, top_k=2, dropless=True),
        loss_chunk_size=PRESET_LOSS_CHUNK_SIZE,
    ),
}

# The published parameter counts of the shapes above (all parameters).
PUBLISHED_PARAMS = {"llama_150m": 135e6, "llama_1b": 1.24e9, "llama_7b": 6.74e9, "mixtral_8x7b": 46.7e9}
# Those a token uses (mixture-of-experts shapes).
PUBLISHED_ACTIVE_PARAMS = {"mixtral_8x7b": 12.9e9}
