"""Model FLOPs: the issue's reference figure and the formula's parts."""

import pytest

from cairn.models import DecoderOnlyConfig, flops_per_token, get_preset
from cairn.models.flops import training_flops_per_step


def test_t5_1_1_small_step_is_200_7_gflop():
    flops = training_flops_per_step(get_preset("t5_1_1_small"), 8, {"inputs": 128, "targets": 32})
    assert flops / 1e9 == pytest.approx(200.7, abs=0.05)
    assert flops_per_token(get_preset("t5_1_1_small"), {"inputs": 128, "targets": 32}) == pytest.approx(flops / 256)


def test_decoder_only_is_six_n_plus_attention():
    c = DecoderOnlyConfig(vocab_size=100, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16, num_layers=3)
    n_matmul = 3 * (4 * 8 * 8 + 3 * 8 * 16) + 8 * 100
    expected = 6 * n_matmul * 10 + 12 * 8 * 3 * 10 * 10
    assert flops_per_token(c, {"targets": 10}) * 10 == pytest.approx(expected)


def test_rejects_other_configs():
    with pytest.raises(TypeError, match="T5Config"):
        flops_per_token(object(), {"targets": 1})
