"""The GPT-style decoder's named configurations (`decoder_only_*`): gated GELU, T5 relative
positions and T5's vocabulary, from 125M to 8B parameters.

`PRESETS` maps each name to its `DecoderOnlyConfig` (`cairn.models.get_preset` and
`cairn.models.PRESETS` reach every family's). All but the toy `decoder_only_tiny` train with the
chunked loss (`transformer_config.preset_loss_chunk_size`).
"""

from __future__ import annotations

from cairn.models.gpt.config import DecoderOnlyConfig
from cairn.models.t5.presets import GATED_GELU, T5_VOCAB
from cairn.models.transformer_config import preset_loss_chunk_size


def _decoder_only(emb, heads, head_dim, mlp, layers, vocab=T5_VOCAB, toy=False) -> DecoderOnlyConfig:
    return DecoderOnlyConfig(
        vocab_size=vocab,
        emb_dim=emb,
        num_heads=heads,
        head_dim=head_dim,
        mlp_dim=mlp,
        num_layers=layers,
        mlp_activations=GATED_GELU,
        loss_chunk_size=0 if toy else preset_loss_chunk_size(vocab),
    )


PRESETS: dict[str, DecoderOnlyConfig] = {
    "decoder_only_tiny": _decoder_only(128, 4, 32, 256, 2, toy=True),
    "decoder_only_125m": _decoder_only(768, 12, 64, 2048, 12),
    "decoder_only_350m": _decoder_only(1024, 16, 64, 2816, 24),
    "decoder_only_1b": _decoder_only(2048, 16, 128, 5120, 20),
    "decoder_only_3b": _decoder_only(2560, 32, 80, 6912, 32),
    "decoder_only_8b": _decoder_only(4096, 32, 128, 14336, 32),
}
