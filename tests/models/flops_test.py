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


def test_moe_llama_counts_the_router_and_top_k_experts():
    from cairn.models import LlamaConfig
    from cairn.models.moe_config import MoeConfig

    moe = MoeConfig(num_experts=4, top_k=2)
    c = LlamaConfig(
        vocab_size=100, emb_dim=8, num_heads=4, num_kv_heads=2, head_dim=2, mlp_dim=16, num_layers=3, moe=moe
    )
    attention = 2 * 8 * 8 + 2 * 8 * 4
    routed_mlp = 8 * 4 + 2 * (3 * 8 * 16)  # router [8, 4] and two SwiGLU experts (not four)
    expected = 6 * (3 * (attention + routed_mlp) + 8 * 100) * 10 + 12 * 8 * 3 * 10 * 10
    assert training_flops_per_step(c, 2, {"targets": 10}) == pytest.approx(2 * expected)
    # Experts of their own width; expert choice uses capacity_factor experts per token on average.
    wide = c.replace(moe=moe.replace(expert_mlp_dim=24))
    assert flops_per_token(wide, {"targets": 10}) - flops_per_token(c, {"targets": 10}) == pytest.approx(
        6 * 3 * 2 * 3 * 8 * 8
    )
    ec = c.replace(moe=moe.replace(routing="expert_choice", capacity_factor=1.5))
    assert flops_per_token(c, {"targets": 10}) - flops_per_token(ec, {"targets": 10}) == pytest.approx(
        6 * 3 * 0.5 * 3 * 8 * 16
    )
    # Dropless expert choice: every expert takes every token.
    everyone = ec.replace(moe=ec.moe.replace(dropless=True))
    assert flops_per_token(everyone, {"targets": 10}) - flops_per_token(c, {"targets": 10}) == pytest.approx(
        6 * 3 * 2 * 3 * 8 * 16
    )


def test_moe_t5_routes_every_second_layer_of_both_stacks():
    from cairn.models import T5Config
    from cairn.models.moe_config import MoeConfig

    dense = T5Config(
        vocab_size=10,
        emb_dim=8,
        num_heads=2,
        head_dim=4,
        mlp_dim=16,
        num_encoder_layers=2,
        num_decoder_layers=3,
        mlp_activations=("gelu", "linear"),
    )
    c = dense.replace(moe=MoeConfig(num_experts=4, top_k=1, every=2))
    li, lt = 12, 5
    attn, half = 4 * 8 * 8, 2 * 8 * 8
    mlp, routed = 3 * 8 * 16, 8 * 4 + 1 * 3 * 8 * 16  # routed: the router and one expert
    enc = (attn + mlp) * li + (attn + routed) * li  # encoder layers 0 (dense) and 1 (routed)
    dec_layer = lambda m: (attn + half + m) * lt + half * li
    dec = dec_layer(mlp) + dec_layer(routed) + dec_layer(mlp)  # decoder layers 0, 1 (routed), 2
    expected = 6 * (enc + dec) + 6 * 8 * 10 * lt + 12 * 8 * (2 * li * li + 3 * (lt * lt + lt * li))
    lengths = {"inputs": li, "targets": lt}
    assert training_flops_per_step(c, 1, lengths) == pytest.approx(expected)
    # Top-1 with the dense width: the router's matmul is all that is added, once per routed layer.
    router = 6 * 8 * 4 * (li + lt)
    assert training_flops_per_step(c, 1, lengths) - training_flops_per_step(dense, 1, lengths) == pytest.approx(router)


def test_moe_decoder_only_counts_active_experts():
    from cairn.models.moe_config import MoeConfig

    c = DecoderOnlyConfig(
        vocab_size=100, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16, num_layers=2, moe=MoeConfig(num_experts=8)
    )
    matmul = 2 * (4 * 8 * 8) + 2 * (8 * 8 + 2 * 3 * 8 * 16) + 8 * 100
    assert flops_per_token(c, {"targets": 10}) * 10 == pytest.approx(6 * matmul * 10 + 12 * 8 * 2 * 10 * 10)
