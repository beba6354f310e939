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


def test_llama_counts_gqa_swiglu_and_tied_logits():
    from cairn.models import LlamaConfig

    c = LlamaConfig(vocab_size=100, emb_dim=8, num_heads=4, num_kv_heads=2, head_dim=2, mlp_dim=16, num_layers=3)
    # q and o: 8 x (4 x 2) each; k and v: 8 x (2 x 2) each (GQA); SwiGLU: gate, up, down 8 x 16.
    per_layer = 2 * 8 * 8 + 2 * 8 * 4 + 3 * 8 * 16
    assert per_layer == 576
    # Every query head attends: 12 x (4 x 2) x layers x L^2; tied logits 6 x 8 x 100 x L.
    expected = 6 * (3 * per_layer + 8 * 100) * 10 + 12 * 8 * 3 * 10 * 10
    assert training_flops_per_step(c, 2, {"targets": 10}) == pytest.approx(2 * expected)
    mha = LlamaConfig(vocab_size=100, emb_dim=8, num_heads=4, num_kv_heads=4, head_dim=2, mlp_dim=16, num_layers=3)
    assert flops_per_token(mha, {"targets": 10}) - flops_per_token(c, {"targets": 10}) == pytest.approx(
        6 * 3 * 2 * 8 * 4
    )
