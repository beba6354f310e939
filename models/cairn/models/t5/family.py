"""Registers the T5 family: `model.kind` "encoder_decoder"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cairn.models import flops, params
from cairn.models.families import SAMPLES_EVAL_PREDICTIONS, HFConverter, ModelFamily, register_family
from cairn.models.t5 import hf
from cairn.models.t5.config import T5Config
from cairn.models.t5.model import EncoderDecoderModel
from cairn.models.t5.network import EncoderDecoder
from cairn.models.t5.presets import PRESETS


def _encoder_batch(prompts: Any) -> Mapping[str, Any]:
    return {"encoder_input_tokens": prompts}


FAMILY = register_family(
    ModelFamily(
        name="encoder_decoder",
        description="T5-family encoder-decoder (T5.1.0, T5.1.1, mT5, ByT5, UL2)",
        config_class=T5Config,
        model_class=EncoderDecoderModel,
        network_class=EncoderDecoder,
        features=("inputs", "targets"),
        feature_converter="EncDecFeatureConverter",
        input_feature="inputs",
        decode_batch=_encoder_batch,
        samples=SAMPLES_EVAL_PREDICTIONS,
        hf=HFConverter(import_dir=hf.import_hf, export_dir=hf.export_hf, config_from_dir=hf.config_from_hf_dir),
        count_params=params.count_params,
        pretrain_optimizer=(
            ("name", "adafactor"),
            ("schedule", "factor"),
            ("learning_rate", 1.0),
            ("warmup_steps", 10000),
        ),
        preset_configs=PRESETS,
        training_flops=flops.encoder_decoder_flops,
    )
)
