"""The model-family registry: what callers need to know about `encoder_decoder`, `decoder_only`
and `llama`.

A `ModelFamily` holds, for one value of an experiment's `model.kind`, its config class,
model and network classes, presets, Hugging Face converter (None where there is none),
parameter count, and the facts the launchers act on (task features, how decoding is fed,
what the post-training samples are). Callers ask the family instead of comparing kind
strings:

    family = get_family(config.model.kind)
    lengths = {k: lengths[k] for k in family.features}
    batch = family.decode_batch(prompts)

`families()` lists every family (registry order); `family_of(config)` finds a network
config's family.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from cairn.models import hf_interchange, params
from cairn.models.decoder_only import Decoder, DecoderOnlyConfig
from cairn.models.decoder_only_model import DecoderOnlyModel
from cairn.models.encoder_decoder_model import EncoderDecoderModel
from cairn.models.llama import hf as llama_hf
from cairn.models.llama.config import LlamaConfig
from cairn.models.llama.network import Llama
from cairn.models.presets import PRESETS
from cairn.models.t5.config import T5Config
from cairn.models.t5.network import EncoderDecoder
from cairn.models.transformer_config import ModelConfig

# `ModelFamily.samples`: what post-training shows of a trained model.
SAMPLES_EVAL_PREDICTIONS = "eval_predictions"  # evaluation examples with the model's predictions
SAMPLES_PROMPT_CONTINUATIONS = "prompt_continuations"  # `post_training.prompts`, continued


class UnknownFamilyError(KeyError):
    """`get_family` of a name that is not registered (its message names the known families)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclasses.dataclass(frozen=True)
class HFConverter:
    """Hugging Face `transformers` interchange of a family (see `hf_interchange`)."""

    import_dir: Callable[..., tuple[Any, Any]]  # (directory, **config_overrides) -> (config, params)
    export_dir: Callable[[Any, Any, str], str]  # (params, config, directory) -> directory
    config_from_dir: Callable[..., Any]  # (directory, **overrides) -> config, weights not loaded


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """One model family, named by its `model.kind` value.

    * `features`: the task features the model reads, each needing a `data.sequence_length`;
    * `feature_converter`: the name of the `cairn.datatasks` feature converter class;
    * `input_feature`: the feature the model is conditioned on (the encoder input), or None
      when it only continues `targets`: then `predict_batch` takes a prompt of target tokens
      and returns it followed by the continuation (`continues_prompt`);
    * `decode_batch(prompts)`: the `predict_batch` argument for `[b, length]` prompt tokens;
    * `samples`: `SAMPLES_EVAL_PREDICTIONS` or `SAMPLES_PROMPT_CONTINUATIONS`;
    * `pretrain_optimizer`: `optimizer.*` settings of a pretraining run at scale (t5x's for T5).
    """

    name: str
    description: str
    config_class: type[ModelConfig]
    model_class: type
    network_class: type
    features: tuple[str, ...]
    feature_converter: str
    input_feature: str | None
    decode_batch: Callable[[Any], Any]
    samples: str
    hf: HFConverter | None
    count_params: Callable[[Any], int]
    pretrain_optimizer: tuple[tuple[str, Any], ...] = ()

    @property
    def continues_prompt(self) -> bool:
        """Whether decoding continues a prompt of target tokens (the output starts with it)."""
        return self.input_feature is None

    @property
    def presets(self) -> tuple[str, ...]:
        """The names of the presets (`cairn.models.PRESETS`) of this family, in registry order."""
        return tuple(name for name, config in PRESETS.items() if type(config) is self.config_class)

    def make_model(self, config: ModelConfig, **kwargs: Any) -> Any:
        """`model_class(config, **kwargs)` (`label_smoothing`, `z_loss`, `loss_normalizing_factor`);
        TypeError when `config` belongs to another family."""
        if type(config) is not self.config_class:
            raise TypeError(
                f"model family {self.name!r} needs a {self.config_class.__name__}, got {type(config).__name__}"
            )
        return self.model_class(config, **kwargs)


def _encoder_batch(prompts: Any) -> Mapping[str, Any]:
    return {"encoder_input_tokens": prompts}


def _prompt_batch(prompts: Any) -> Any:
    return prompts


# AdamW with a cosine schedule to a tenth of the peak (GPT-3 / Llama 2 pretraining settings).
_LM_PRETRAIN_OPTIMIZER = (
    ("name", "adamw"),
    ("schedule", "cosine"),
    ("learning_rate", 3e-4),
    ("warmup_steps", 2000),
    ("final_learning_rate", 3e-5),
    ("weight_decay", 0.1),
    ("b2", 0.95),
    ("clip_grad_norm", 1.0),
)


_FAMILIES: dict[str, ModelFamily] = {
    f.name: f
    for f in (
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
            hf=HFConverter(
                import_dir=hf_interchange.import_hf,
                export_dir=hf_interchange.export_hf,
                config_from_dir=hf_interchange.config_from_hf_dir,
            ),
            count_params=params.count_params,
            pretrain_optimizer=(
                ("name", "adafactor"),
                ("schedule", "factor"),
                ("learning_rate", 1.0),
                ("warmup_steps", 10000),
            ),
        ),
        ModelFamily(
            name="decoder_only",
            description="GPT-style decoder with T5 layers (prefix LM optional)",
            config_class=DecoderOnlyConfig,
            model_class=DecoderOnlyModel,
            network_class=Decoder,
            features=("targets",),
            feature_converter="LMFeatureConverter",
            input_feature=None,
            decode_batch=_prompt_batch,
            samples=SAMPLES_PROMPT_CONTINUATIONS,
            hf=None,  # hf_interchange maps transformers' T5 layout only
            count_params=params.count_params,
            pretrain_optimizer=_LM_PRETRAIN_OPTIMIZER,
        ),
        ModelFamily(
            name="llama",
            description="Llama decoder (RoPE, grouped-query attention, SwiGLU, RMSNorm; Llama 1/2/3 shapes)",
            config_class=LlamaConfig,
            model_class=DecoderOnlyModel,
            network_class=Llama,
            features=("targets",),
            feature_converter="LMFeatureConverter",
            input_feature=None,
            decode_batch=_prompt_batch,
            samples=SAMPLES_PROMPT_CONTINUATIONS,
            hf=HFConverter(
                import_dir=llama_hf.import_hf,
                export_dir=llama_hf.export_hf,
                config_from_dir=llama_hf.config_from_hf_dir,
            ),
            count_params=params.count_params,
            pretrain_optimizer=_LM_PRETRAIN_OPTIMIZER,
        ),
    )
}


def families() -> tuple[ModelFamily, ...]:
    """Every registered family, in registry order."""
    return tuple(_FAMILIES.values())


def names() -> tuple[str, ...]:
    """The family names (the allowed `model.kind` values), in registry order."""
    return tuple(_FAMILIES)


def get_family(name: str) -> ModelFamily:
    """The family called `name`; `UnknownFamilyError` (a KeyError) naming the known families otherwise."""
    if name not in _FAMILIES:
        raise UnknownFamilyError(f"unknown model family {name!r}; known families: {', '.join(_FAMILIES)}")
    return _FAMILIES[name]


def family_of(config: Any) -> ModelFamily:
    """The family whose config class `config` is; TypeError naming the config classes otherwise."""
    for family in _FAMILIES.values():
        if type(config) is family.config_class:
            return family
    known = ", ".join(f.config_class.__name__ for f in _FAMILIES.values())
    raise TypeError(f"{type(config).__name__} is not the config of a model family (known: {known})")
