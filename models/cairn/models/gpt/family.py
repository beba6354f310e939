"""Registers the GPT-style decoder family: `model.kind` "decoder_only"."""

from __future__ import annotations

from cairn.models import flops, params
from cairn.models.decoder_only_model import DecoderOnlyModel
from cairn.models.families import (
    LM_PRETRAIN_OPTIMIZER,
    SAMPLES_PROMPT_CONTINUATIONS,
    ModelFamily,
    prompt_batch,
    register_family,
)
from cairn.models.gpt.config import DecoderOnlyConfig
from cairn.models.gpt.network import Decoder
from cairn.models.gpt.presets import PRESETS

FAMILY = register_family(
    ModelFamily(
        name="decoder_only",
        description="GPT-style decoder with T5 layers (prefix LM optional)",
        config_class=DecoderOnlyConfig,
        model_class=DecoderOnlyModel,
        network_class=Decoder,
        features=("targets",),
        feature_converter="LMFeatureConverter",
        input_feature=None,
        decode_batch=prompt_batch,
        samples=SAMPLES_PROMPT_CONTINUATIONS,
        hf=None,  # no transformers model has its layout (T5 layers without cross-attention)
        count_params=params.count_params,
        pretrain_optimizer=LM_PRETRAIN_OPTIMIZER,
        preset_configs=PRESETS,
        training_flops=flops.decoder_flops,
    )
)
