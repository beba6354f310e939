"""Presets and `count_params` against the published sizes."""

import pytest

from cairn.models import PRESETS, DecoderOnlyConfig, LlamaConfig, T5Config, count_params, get_preset


def _count(name: str) -> int:
    """`count_params` of a preset, counted on its scanned layout (one layer traced instead of
    up to 48: the count is the same, `test_exact_count_of_a_tiny_config` checks that)."""
    return count_params(get_preset(name, scan_layers=True))


# Parameter counts of the released T5 v1.1 checkpoints.
PUBLISHED_T5_1_1 = {"small": 77e6, "base": 248e6, "large": 783e6, "xl": 2.85e9, "xxl": 11.1e9}


@pytest.mark.parametrize("size", sorted(PUBLISHED_T5_1_1))
def test_t5_1_1_sizes_within_half_a_percent(size):
    n = _count(f"t5_1_1_{size}")
    assert abs(n / PUBLISHED_T5_1_1[size] - 1) < 0.005, (size, n)


@pytest.mark.parametrize(
    "name,expected",
    [
        ("t5_1_0_small", 60.5e6),
        ("t5_1_0_11b", 11.3e9),
        ("mt5_small", 300e6),
        ("byt5_small", 300e6),
        ("decoder_only_125m", 134e6),
        ("decoder_only_8b", 8.0e9),
    ],
)
def test_other_families_in_the_right_range(name, expected):
    assert abs(_count(name) / expected - 1) < 0.02


def test_exact_count_of_a_tiny_config():
    c = T5Config(
        vocab_size=10,
        emb_dim=4,
        num_heads=2,
        head_dim=3,
        mlp_dim=5,
        num_encoder_layers=1,
        num_decoder_layers=1,
        mlp_activations=("relu",),
        logits_via_embedding=True,
        relative_attention_num_buckets=8,
    )
    attn = 4 * 4 * 6
    expected = 10 * 4 + 2 * 2 * 8 + (attn + 2 * 4 * 5 + 2 * 4 + 4) + (2 * attn + 2 * 4 * 5 + 3 * 4 + 4)
    assert count_params(c) == expected
    assert count_params(c.replace(logits_via_embedding=False)) == expected + 4 * 10
    assert count_params(c.replace(scan_layers=True)) == expected


def test_every_preset_is_a_config():
    for name, config in PRESETS.items():
        assert isinstance(config, (T5Config, DecoderOnlyConfig, LlamaConfig)), name
    assert get_preset("t5_1_1_base", scan_layers=True).scan_layers


def test_full_size_presets_of_large_vocabularies_default_to_the_chunked_loss():
    """Every preset of 32,000 words or more trains with the chunked loss, but the toy `*_tiny` ones
    (their CPU runs swap in a small vocabulary); ByT5's 384 ids and the toys keep whole logits."""
    from cairn.models.transformer_config import CHUNKED_LOSS_MIN_VOCAB, PRESET_LOSS_CHUNK_SIZE

    for name, config in PRESETS.items():
        large = config.vocab_size >= CHUNKED_LOSS_MIN_VOCAB and not name.endswith("_tiny")
        assert config.loss_chunk_size == (PRESET_LOSS_CHUNK_SIZE if large else 0), name
    chunked = {n for n, c in PRESETS.items() if c.loss_chunk_size}
    assert {"llama_1b", "llama_7b", "mixtral_8x7b", "t5_1_1_base", "mt5_xl", "decoder_only_1b"} <= chunked
    assert not chunked & {"t5_1_1_tiny", "decoder_only_tiny", "llama_tiny", "byt5_small"}
    assert get_preset("llama_1b", loss_chunk_size=0).loss_chunk_size == 0  # a run may still choose whole logits


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(KeyError, match="t5_1_1_base"):
        get_preset("t5_1_1_medium")


def test_bad_config_values_are_named():
    with pytest.raises(ValueError, match="remat_policy"):
        T5Config(remat_policy="sometimes")
    with pytest.raises(ValueError, match="mlp_activations"):
        T5Config(mlp_activations=("swish",))
    with pytest.raises(ValueError, match="num_heads"):
        T5Config(num_heads=0)
