"""The launchers ask `cairn.models` model families instead of comparing `model.kind` strings."""

import pathlib
import re
import types

import pytest

import cairn.launchers
from cairn.launchers import config_base, post_training, run_spec, validation
from cairn.launchers import data as data_lib
from cairn.launchers.validation import ConfigError
from cairn.models import families

LAUNCHERS_SRC = pathlib.Path(cairn.launchers.__file__).parent
KIND_LITERAL = re.compile(r"""["'](encoder_decoder|decoder_only)["']""")
COMPARISON = re.compile(
    r"""(==|!=|\bin\b)\s*\(?\s*["'](encoder_decoder|decoder_only)["']"""
    r"""|["'](encoder_decoder|decoder_only)["']\s*(==|!=|\bin\b)"""
    r"""|\bkind\s*(==|!=)\s*[\w"']"""
)


def _sources():
    files = sorted(LAUNCHERS_SRC.rglob("*.py"))
    assert len(files) > 10, LAUNCHERS_SRC
    return files


def test_no_launcher_compares_model_kind_strings():
    found = [
        f"{p.relative_to(LAUNCHERS_SRC)}:{i}: {line.strip()}"
        for p in _sources()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if COMPARISON.search(line) and "vocabulary.kind" not in line
    ]
    assert not found, "compare the model family instead (config_base.model_family):\n" + "\n".join(found)


def test_family_names_appear_only_where_the_default_kind_is_set():
    found = [
        f"{p.name}: {line.strip()}"
        for p in _sources()
        for line in p.read_text().splitlines()
        if KIND_LITERAL.search(line)
    ]
    assert found == [
        'schema.py: kind: str = knob("encoder_decoder", "a cairn.models model family", choices=MODEL_KINDS)'
    ], found


def _typed(config):
    """The typed keys of `config` (its schema checked): what the launchers' checks take."""
    return run_spec.checked_keys(config)[1]


def test_model_kinds_derive_from_the_registry():
    assert config_base.MODEL_KINDS == config_base.model_kinds() == families.names()
    assert config_base.model_family("decoder_only") is families.get_family("decoder_only")


def test_an_unknown_kind_is_a_config_error_naming_the_kinds():
    config = config_base.base_config()
    config.model.kind = "gpt"
    with pytest.raises(ConfigError, match=r"'model.kind': unknown value 'gpt'; allowed: decoder_only, encoder_decoder"):
        run_spec.checked_keys(config)
    with pytest.raises(
        ConfigError,
        match=r"'model.kind': unknown model family 'gpt'; known families: "
        r"encoder_decoder, decoder_only",
    ):
        config_base.model_family("gpt")


@pytest.mark.parametrize(
    "kind,lengths,converter",
    [
        ("encoder_decoder", {"inputs": 512, "targets": 114}, "EncDecFeatureConverter"),
        ("decoder_only", {"targets": 114}, "LMFeatureConverter"),
    ],
)
def test_data_follows_the_family(kind, lengths, converter):
    config = config_base.base_config()
    config.model.kind = kind
    reader = run_spec.ReaderSpec.of(_typed(config))
    assert reader.sequence_length == lengths
    assert type(data_lib.feature_converter(reader)).__name__ == converter


def test_check_data_names_the_lengths_a_family_needs():
    config = config_base.base_config()
    config.data.sequence_length = {"targets": 64}
    with pytest.raises(
        ConfigError,
        match=r"'data.sequence_length.inputs': missing: a encoder_decoder model needs "
        r"lengths for inputs, targets; given: targets",
    ):
        validation.check_data(_typed(config), {})
    config.model.kind = "decoder_only"
    validation.check_data(_typed(config), {})


def test_a_preset_of_another_family_lists_the_family_presets():
    config = config_base.base_config()
    config.model.kind = "decoder_only"
    with pytest.raises(
        ConfigError,
        match=r"'t5_1_1_tiny' is not a decoder_only preset; decoder_only presets: "
        r"decoder_only_tiny, decoder_only_125m",
    ):
        validation.check_model(_typed(config))
    config.model.preset = "decoder_only_tiny"
    assert type(validation.check_model(_typed(config))).__name__ == "DecoderOnlyConfig"


def test_hf_checkpoint_needs_a_family_with_a_converter(tmp_path):
    config = config_base.base_config()
    config.vocabulary.kind = "byte"
    config.model.kind = "decoder_only"
    config.init.hf_checkpoint = str(tmp_path)
    with pytest.raises(
        ConfigError,
        match=r"'init.hf_checkpoint': Hugging Face import covers encoder_decoder, llama "
        r"models only; model.kind is 'decoder_only'",
    ):
        validation.check_paths(_typed(config))
    config.model.kind = "encoder_decoder"
    validation.check_paths(_typed(config))
    config.model.kind = "llama"  # cairn.models.llama.hf
    validation.check_paths(_typed(config))


def test_pretrain_takes_the_family_optimizer():
    t5, lm = config_base.base_config(), config_base.base_config()
    config_base.pretrain(t5, "t5_1_1_small", "encoder_decoder", "task", {"inputs": 512, "targets": 114}, 256, 10)
    config_base.pretrain(lm, "decoder_only_125m", "decoder_only", "task", {"targets": 1024}, 256, 10)
    o = t5.optimizer
    assert (o.name, o.schedule, o.learning_rate, o.warmup_steps, o.clip_grad_norm) == (
        "adafactor",
        "factor",
        1.0,
        10000,
        None,
    )
    o = lm.optimizer
    assert (
        o.name,
        o.schedule,
        o.learning_rate,
        o.warmup_steps,
        o.final_learning_rate,
        o.weight_decay,
        o.b2,
        o.clip_grad_norm,
    ) == ("adamw", "cosine", 3e-4, 2000, 3e-5, 0.1, 0.95, 1.0)
    run_spec.checked_keys(t5)
    run_spec.checked_keys(lm)
    with pytest.raises(ConfigError, match="'model.kind'"):
        config_base.pretrain(config_base.base_config(), "x", "gpt", "task", {}, 1, 1)


@pytest.mark.parametrize("kind,expected", [("encoder_decoder", {"samples"}), ("decoder_only", {"generated"})])
def test_post_training_samples_follow_the_family(kind, expected, monkeypatch):
    config = config_base.base_config()
    config.model.kind = kind
    monkeypatch.setattr(post_training, "denoising_samples", lambda *a, **k: ["sample"])
    monkeypatch.setattr(post_training, "generate_text", lambda *a, **k: ["text"])
    config.post_training.final_eval = False
    spec = types.SimpleNamespace(keys=_typed(config))  # what `run` reads of a `RunSpec` before sampling
    result = post_training.run(spec, None, None, object(), 0, object(), out=lambda s: None)
    assert set(result) == expected
