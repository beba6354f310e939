"""Registers the Llama family (Llama 1/2/3 and Mixtral shapes): `model.kind` "llama"."""

from __future__ import annotations

from cairn.models import flops, params
from cairn.models.decoder_only_model import DecoderOnlyModel
from cairn.models.families import (
    LM_PRETRAIN_OPTIMIZER,
    SAMPLES_PROMPT_CONTINUATIONS,
    HFConverter,
    ModelFamily,
    prompt_batch,
    register_family,
)
from cairn.models.llama import hf
from cairn.models.llama.config import LlamaConfig
from cairn.models.llama.network import Llama
from cairn.models.llama.presets import PRESETS

FAMILY = register_family(
    ModelFamily(
        name="llama",
        description="Llama decoder (RoPE, grouped-query attention, SwiGLU, RMSNorm; Llama 1/2/3 shapes)",
        config_class=LlamaConfig,
        model_class=DecoderOnlyModel,
        network_class=Llama,
        features=("targets",),
        feature_converter="LMFeatureConverter",
        input_feature=None,
        decode_batch=prompt_batch,
        samples=SAMPLES_PROMPT_CONTINUATIONS,
        hf=HFConverter(import_dir=hf.import_hf, export_dir=hf.export_hf, config_from_dir=hf.config_from_hf_dir),
        count_params=params.count_params,
        pretrain_optimizer=LM_PRETRAIN_OPTIMIZER,
        preset_configs=PRESETS,
        training_flops=flops.llama_flops,
    )
)
