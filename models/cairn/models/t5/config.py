"""T5Config: the hyperparameters of a T5-family encoder-decoder (T5.1.0, T5.1.1, mT5, ByT5, UL2)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from cairn.models.transformer_config import ACTIVATIONS, REMAT_POLICIES, TransformerConfig

__all__ = ["ACTIVATIONS", "REMAT_POLICIES", "T5Config"]


@dataclasses.dataclass(frozen=True)
class T5Config(TransformerConfig):
    """Hyperparameters of `t5.EncoderDecoder`: the shared `TransformerConfig` fields (defaults:
    T5.1.1-small) and the depth of each stack."""

    LAYER_FIELDS: ClassVar[tuple[str, ...]] = ("num_encoder_layers", "num_decoder_layers")

    num_encoder_layers: int = 8
    num_decoder_layers: int = 8
