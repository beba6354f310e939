"""`DecoderOnlyConfig`: the hyperparameters of the GPT-style decoder (`gpt.Decoder`)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from cairn.models.transformer_config import TransformerConfig, check_prompt_start_id


@dataclasses.dataclass(frozen=True)
class DecoderOnlyConfig(TransformerConfig):
    """Hyperparameters of `gpt.Decoder`: the shared `TransformerConfig` fields (as in
    `T5Config`; defaults: `decoder_only_125m`), the number of layers, and `prompt_start_id`:
    what `predict_batch` puts in front of every prompt (0, T5's decoder start, by default;
    None: nothing, the prompt holds its own start; `transformer_config.check_prompt_start_id`)."""

    LAYER_FIELDS: ClassVar[tuple[str, ...]] = ("num_layers",)

    emb_dim: int = 768
    num_heads: int = 12
    mlp_dim: int = 2048
    num_layers: int = 12
    prompt_start_id: int | None = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_prompt_start_id(self)
