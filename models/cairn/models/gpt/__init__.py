"""The GPT-style decoder family (`model.kind` "decoder_only"): `DecoderOnlyConfig` and the `Decoder`
network (T5 layers without cross-attention, prefix LM optional); `gpt.presets` and `gpt.family`
(its registration) are imported on their own."""

from cairn.models.gpt.config import DecoderOnlyConfig
from cairn.models.gpt.network import Decoder

__all__ = ["Decoder", "DecoderOnlyConfig"]
