"""The T5 family's named configurations: T5.1.1, T5.1.0, mT5, ByT5, UL2 and ST-MoE-style sizes.

`PRESETS` maps each name to its `T5Config` (`cairn.models.get_preset` and `cairn.models.PRESETS`
reach every family's). Sizes follow the published checkpoints' `config.json` / gin files. The
full-size presets of T5's and mT5's vocabularies train with the chunked loss
(`transformer_config.preset_loss_chunk_size`); the toy `*_tiny` ones and ByT5 (384 ids) with
whole logits.
"""

from __future__ import annotations

from cairn.models.moe_config import MoeConfig
from cairn.models.t5.config import T5Config
from cairn.models.transformer_config import preset_loss_chunk_size

T5_VOCAB = 32128
MT5_VOCAB = 250112
BYT5_VOCAB = 384
GATED_GELU = ("gelu", "linear")


def _t5_1_1(emb, heads, mlp, layers, vocab=T5_VOCAB, head_dim=64, dec_layers=None, toy=False) -> T5Config:
    return T5Config(
        vocab_size=vocab,
        emb_dim=emb,
        num_heads=heads,
        head_dim=head_dim,
        mlp_dim=mlp,
        num_encoder_layers=layers,
        num_decoder_layers=dec_layers or layers,
        mlp_activations=GATED_GELU,
        logits_via_embedding=False,
        loss_chunk_size=0 if toy else preset_loss_chunk_size(vocab),
    )


def _t5_1_0(emb, heads, mlp, layers, head_dim=64) -> T5Config:
    return T5Config(
        vocab_size=T5_VOCAB,
        emb_dim=emb,
        num_heads=heads,
        head_dim=head_dim,
        mlp_dim=mlp,
        num_encoder_layers=layers,
        num_decoder_layers=layers,
        mlp_activations=("relu",),
        logits_via_embedding=True,
        loss_chunk_size=preset_loss_chunk_size(T5_VOCAB),
    )


PRESETS: dict[str, T5Config] = {
    # T5.1.1 (gated GELU, untied logits).
    "t5_1_1_tiny": _t5_1_1(128, 4, 256, 2, head_dim=32, toy=True),
    "t5_1_1_small": _t5_1_1(512, 6, 1024, 8),
    "t5_1_1_base": _t5_1_1(768, 12, 2048, 12),
    "t5_1_1_large": _t5_1_1(1024, 16, 2816, 24),
    "t5_1_1_xl": _t5_1_1(2048, 32, 5120, 24),
    "t5_1_1_xxl": _t5_1_1(4096, 64, 10240, 24),
    # T5.1.0 (ReLU, logits tied to the embedding).
    "t5_1_0_small": _t5_1_0(512, 8, 2048, 6),
    "t5_1_0_base": _t5_1_0(768, 12, 3072, 12),
    "t5_1_0_large": _t5_1_0(1024, 16, 4096, 24),
    "t5_1_0_3b": _t5_1_0(1024, 32, 16384, 24, head_dim=128),
    "t5_1_0_11b": _t5_1_0(1024, 128, 65536, 24, head_dim=128),
    # mT5: T5.1.1 shapes with a 250k vocabulary.
    "mt5_small": _t5_1_1(512, 6, 1024, 8, MT5_VOCAB),
    "mt5_base": _t5_1_1(768, 12, 2048, 12, MT5_VOCAB),
    "mt5_large": _t5_1_1(1024, 16, 2816, 24, MT5_VOCAB),
    "mt5_xl": _t5_1_1(2048, 32, 5120, 24, MT5_VOCAB),
    "mt5_xxl": _t5_1_1(4096, 64, 10240, 24, MT5_VOCAB),
    # ByT5: bytes, encoder three times deeper than the decoder.
    "byt5_small": _t5_1_1(1472, 6, 3584, 12, BYT5_VOCAB, dec_layers=4),
    "byt5_base": _t5_1_1(1536, 12, 3968, 18, BYT5_VOCAB, dec_layers=6),
    "byt5_large": _t5_1_1(1536, 16, 3840, 36, BYT5_VOCAB, dec_layers=12),
    "byt5_xl": _t5_1_1(2560, 32, 6720, 36, BYT5_VOCAB, dec_layers=12),
    "byt5_xxl": _t5_1_1(4672, 64, 12352, 36, BYT5_VOCAB, dec_layers=12),
    # UL2 20B (gated SiLU).
    "ul2_20b": T5Config(
        vocab_size=T5_VOCAB,
        emb_dim=4096,
        num_heads=16,
        head_dim=256,
        mlp_dim=16384,
        num_encoder_layers=32,
        num_decoder_layers=32,
        mlp_activations=("silu", "linear"),
        loss_chunk_size=preset_loss_chunk_size(T5_VOCAB),
    ),
    # ST-MoE-style (Zoph et al. 2022) on t5_1_1_tiny's shape, for tests and toy runs: every
    # second encoder and decoder MLP routed, 4 experts, top 2, capacity factor 1.25, the
    # load-balancing (0.01) and router z (0.001) losses.
    "st_moe_tiny": _t5_1_1(128, 4, 256, 2, head_dim=32, toy=True).replace(
        moe=MoeConfig(num_experts=4, top_k=2, every=2)
    ),
}
