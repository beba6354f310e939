"""The model-family registry, the shared `ModelConfig` of every family and the `TransformerConfig`
of T5 and decoder-only configs."""

import dataclasses
import re

import numpy as np
import pytest

from cairn.models import (
    PRESETS,
    DecoderOnlyConfig,
    DecoderOnlyModel,
    EncoderDecoderModel,
    Llama,
    LlamaConfig,
    ModelConfig,
    T5Config,
    TransformerConfig,
    UnknownFamilyError,
    count_params,
    export_hf,
    families,
    family_of,
    flops_per_token,
    get_family,
    get_preset,
    import_hf,
)
from cairn.models.flops import decoder_flops
from cairn.models.gpt import Decoder
from cairn.models.llama import hf as llama_hf
from cairn.models.t5.hf import config_from_hf_dir
from cairn.models.t5.network import EncoderDecoder


def test_names_and_lookup():
    assert families.names() == ("encoder_decoder", "decoder_only", "llama")
    assert [f.name for f in families.families()] == list(families.names())
    for family in families.families():
        assert get_family(family.name) is family


def test_unknown_family_names_the_known_ones():
    with pytest.raises(UnknownFamilyError) as e:
        get_family("gpt")
    assert str(e.value) == "unknown model family 'gpt'; known families: encoder_decoder, decoder_only, llama"
    assert isinstance(e.value, KeyError)


def test_encoder_decoder_facts():
    f = get_family("encoder_decoder")
    assert (f.config_class, f.model_class, f.network_class) == (T5Config, EncoderDecoderModel, EncoderDecoder)
    assert f.features == ("inputs", "targets") and f.input_feature == "inputs" and not f.continues_prompt
    assert f.feature_converter == "EncDecFeatureConverter"
    assert f.samples == families.SAMPLES_EVAL_PREDICTIONS
    x = np.zeros((2, 3), np.int32)
    assert f.decode_batch(x)["encoder_input_tokens"] is x
    assert f.hf is not None and f.hf.import_dir is import_hf and f.hf.export_dir is export_hf
    assert f.hf.config_from_dir is config_from_hf_dir
    assert dict(f.pretrain_optimizer) == {
        "name": "adafactor",
        "schedule": "factor",
        "learning_rate": 1.0,
        "warmup_steps": 10000,
    }
    assert "t5_1_1_base" in f.presets and "ul2_20b" in f.presets and "st_moe_tiny" in f.presets
    assert "decoder_only_125m" not in f.presets


def test_decoder_only_facts():
    f = get_family("decoder_only")
    assert (f.config_class, f.model_class, f.network_class) == (DecoderOnlyConfig, DecoderOnlyModel, Decoder)
    assert f.features == ("targets",) and f.input_feature is None and f.continues_prompt
    assert f.feature_converter == "LMFeatureConverter"
    assert f.samples == families.SAMPLES_PROMPT_CONTINUATIONS
    x = np.zeros((2, 3), np.int32)
    assert f.decode_batch(x) is x
    assert f.hf is None  # no transformers model has its layout
    assert dict(f.pretrain_optimizer) == {
        "name": "adamw",
        "schedule": "cosine",
        "learning_rate": 3e-4,
        "warmup_steps": 2000,
        "final_learning_rate": 3e-5,
        "weight_decay": 0.1,
        "b2": 0.95,
        "clip_grad_norm": 1.0,
    }
    assert f.presets == (
        "decoder_only_tiny",
        "decoder_only_125m",
        "decoder_only_350m",
        "decoder_only_1b",
        "decoder_only_3b",
        "decoder_only_8b",
    )


def test_llama_facts():
    f = get_family("llama")
    assert (f.config_class, f.model_class, f.network_class) == (LlamaConfig, DecoderOnlyModel, Llama)
    assert f.features == ("targets",) and f.input_feature is None and f.continues_prompt
    assert f.feature_converter == "LMFeatureConverter" and f.samples == families.SAMPLES_PROMPT_CONTINUATIONS
    assert f.hf is not None and f.hf.import_dir is llama_hf.import_hf and f.hf.export_dir is llama_hf.export_hf
    assert f.hf.config_from_dir is llama_hf.config_from_hf_dir
    assert f.pretrain_optimizer == get_family("decoder_only").pretrain_optimizer
    assert f.presets == ("llama_tiny", "llama_150m", "llama_1b", "llama_7b", "mixtral_tiny", "mixtral_8x7b")
    model = f.make_model(PRESETS["llama_tiny"])
    assert isinstance(model.module, Llama)
    other = DecoderOnlyModel(PRESETS["llama_tiny"], network=Decoder(PRESETS["decoder_only_tiny"]))
    assert isinstance(other.module, Decoder)


def test_every_preset_belongs_to_exactly_one_family():
    owners = {name: [f.name for f in families.families() if name in f.presets] for name in PRESETS}
    assert all(len(o) == 1 for o in owners.values()), owners
    for name, config in PRESETS.items():
        assert family_of(config).name == owners[name][0]


BUILTIN = ("encoder_decoder", "decoder_only", "llama")


@dataclasses.dataclass(frozen=True)
class ToyConfig(DecoderOnlyConfig):
    """A new family's config (here the GPT-style decoder's fields, its network and model reused)."""


TOY_TINY = ToyConfig(vocab_size=67, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=48, num_layers=2)


def _toy(**changes):
    """What a new family's `family.py` passes to `register_family`."""
    fields = dict(
        name="toy",
        description="a toy decoder",
        config_class=ToyConfig,
        model_class=DecoderOnlyModel,
        network_class=Decoder,
        features=("targets",),
        feature_converter="LMFeatureConverter",
        input_feature=None,
        decode_batch=families.prompt_batch,
        samples=families.SAMPLES_PROMPT_CONTINUATIONS,
        hf=None,
        count_params=count_params,
        pretrain_optimizer=families.LM_PRETRAIN_OPTIMIZER,
        preset_configs={"toy_tiny": TOY_TINY},
    )
    return families.ModelFamily(**{**fields, **changes})


def test_a_new_family_is_one_registration_and_leaves_when_unregistered(tiny):
    toy = families.register_family(_toy())
    try:
        assert families.names() == BUILTIN + ("toy",)
        assert get_family("toy") is toy and family_of(TOY_TINY) is toy
        assert toy.presets == ("toy_tiny",) and list(PRESETS)[-1] == "toy_tiny" and PRESETS["toy_tiny"] is TOY_TINY
        assert get_preset("toy_tiny", num_layers=3) == TOY_TINY.replace(num_layers=3)
        model = toy.make_model(TOY_TINY, z_loss=0.0)  # params.network_for knows the new config class
        assert isinstance(model, DecoderOnlyModel) and isinstance(model.module, Decoder)
        assert toy.count_params(TOY_TINY) == count_params(tiny.decoder_only)
        with pytest.raises(TypeError, match="model family 'toy' declares no training FLOPs"):
            flops_per_token(TOY_TINY, {"targets": 16})  # no MFU for it, not a wrong one
    finally:
        assert families.unregister_family("toy") is toy
    # Its own FLOP formula is the one MFU uses (here the GPT-style decoder's, doubled).
    toy = families.register_family(_toy(training_flops=lambda c, lengths: 2 * decoder_flops(c, lengths)))
    try:
        lengths = {"targets": 16}
        assert flops_per_token(TOY_TINY, lengths) == 2 * flops_per_token(tiny.decoder_only, lengths) > 0
    finally:
        families.unregister_family("toy")
    assert families.names() == BUILTIN
    assert "toy_tiny" not in PRESETS and len(PRESETS) == len(list(PRESETS))
    with pytest.raises(TypeError, match="ToyConfig is not the config of a model family"):
        family_of(TOY_TINY)
    with pytest.raises(TypeError, match="got ToyConfig"):
        count_params(TOY_TINY)
    with pytest.raises(UnknownFamilyError, match="unknown model family 'toy'"):
        families.unregister_family("toy")


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"name": "llama"}, "model family 'llama' is already registered"),
        ({"config_class": T5Config}, "config class T5Config is already registered by model family 'encoder_decoder'"),
        (
            {"preset_configs": {"decoder_only_tiny": TOY_TINY}},
            "model family 'toy': preset 'decoder_only_tiny' is already registered by model family 'decoder_only'",
        ),
    ],
)
def test_a_second_family_with_a_registered_name_config_class_or_preset_is_refused(changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        families.register_family(_toy(**changes))
    assert families.names() == BUILTIN


def test_registry_order_is_the_package_order_whichever_registers_first():
    first = list(PRESETS)
    t5 = families.unregister_family("encoder_decoder")
    try:
        assert families.names() == BUILTIN[1:]
        assert "t5_1_1_tiny" not in PRESETS
    finally:
        families.register_family(t5)  # now the last to register
    assert families.names() == BUILTIN and list(PRESETS) == first
    assert first[:2] == ["t5_1_1_tiny", "t5_1_1_small"] and first[-1] == "mixtral_8x7b"
    assert first == [name for f in families.families() for name in f.presets]


def test_family_of_something_else_is_a_type_error():
    with pytest.raises(TypeError, match="T5Config, DecoderOnlyConfig, LlamaConfig"):
        family_of(TransformerConfig())


def test_make_model_and_count_params(tiny):
    for config in (tiny.t5_1_1, tiny.decoder_only):
        family = family_of(config)
        model = family.make_model(config, z_loss=0.0)
        assert isinstance(model, family.model_class) and model.config is config
        assert family.count_params(config) == count_params(config)
    with pytest.raises(TypeError, match="needs a T5Config, got DecoderOnlyConfig"):
        get_family("encoder_decoder").make_model(tiny.decoder_only)


def test_every_family_config_shares_the_model_config_fields():
    common = [f.name for f in dataclasses.fields(ModelConfig)]
    for family in families.families():
        assert issubclass(family.config_class, ModelConfig)
        names = [f.name for f in dataclasses.fields(family.config_class)]
        assert names[: len(common)] == common
    assert "relative_attention_num_buckets" not in [f.name for f in dataclasses.fields(LlamaConfig)]


def test_configs_share_the_transformer_fields():
    shared = [f.name for f in dataclasses.fields(TransformerConfig)]
    layers = {T5Config: ["num_encoder_layers", "num_decoder_layers"], DecoderOnlyConfig: ["num_layers"]}
    for cls, own in ((T5Config, []), (DecoderOnlyConfig, ["prompt_start_id"])):
        assert issubclass(cls, TransformerConfig)
        assert [f.name for f in dataclasses.fields(cls)] == shared + layers[cls] + own
        assert cls.LAYER_FIELDS == tuple(layers[cls])
    # Each keeps its family's default size (T5.1.1-small, decoder_only_125m).
    assert (T5Config().emb_dim, T5Config().num_heads, T5Config().mlp_dim) == (512, 6, 1024)
    assert DecoderOnlyConfig() == PRESETS["decoder_only_125m"].replace(vocab_size=32128, loss_chunk_size=0)


@pytest.mark.parametrize("cls", [T5Config, DecoderOnlyConfig])
@pytest.mark.parametrize(
    "field,value",
    [
        ("dropout_rate", 1.0),
        ("dtype", "int8"),
        ("num_heads", 0),
        ("relative_attention_num_buckets", 0),
        ("remat_policy", "some"),
        ("mlp_activations", ("swish",)),
    ],
)
def test_both_configs_validate_the_shared_fields_alike(cls, field, value):
    with pytest.raises(ValueError, match=rf"^{cls.__name__}\.{field} "):
        cls(**{field: value})


@pytest.mark.parametrize(
    "cls,field", [(T5Config, "num_encoder_layers"), (T5Config, "num_decoder_layers"), (DecoderOnlyConfig, "num_layers")]
)
def test_layer_counts_are_positive(cls, field):
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.{field} must be a positive int"):
        cls(**{field: 0})


@pytest.mark.parametrize("cls", [DecoderOnlyConfig, LlamaConfig])
def test_decoder_only_configs_check_the_prompt_start_id(cls):
    assert cls().prompt_start_id == 0 and cls(prompt_start_id=None).prompt_start_id is None
    for bad in (-1, cls().vocab_size, 1.0, True):
        with pytest.raises(ValueError, match=rf"^{cls.__name__}\.prompt_start_id must be None or a token id in \[0, "):
            cls(prompt_start_id=bad)


def test_replace_keeps_the_class():
    c = DecoderOnlyConfig(num_layers=2).replace(dropout_rate=0.1)
    assert type(c) is DecoderOnlyConfig and c.dropout_rate == 0.1 and c.num_layers == 2
