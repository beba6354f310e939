"""Llama presets against the published parameter counts of their shapes, the exact count of a
small config, and Llama's training FLOPs (GQA attention, SwiGLU)."""

import pytest

from cairn.models import LlamaConfig, count_params, flops_per_token, get_preset
from cairn.models.flops import training_flops_per_step
from cairn.models.llama.presets import PUBLISHED_ACTIVE_PARAMS, PUBLISHED_PARAMS


def _count(config: LlamaConfig, active: bool = False) -> int:
    """`count_params` of a config, counted on its scanned layout (one layer traced instead of up
    to 32: the count is the same, `test_exact_count_of_a_small_config` checks that)."""
    return count_params(config.replace(scan_layers=True), active=active)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_counts_within_one_percent_of_the_published_figures(name):
    n = _count(get_preset(name))
    assert abs(n / PUBLISHED_PARAMS[name] - 1) < 0.01, (name, n)


def test_the_published_shapes():
    one, seven = get_preset("llama_1b"), get_preset("llama_7b")
    assert (one.num_layers, one.emb_dim, one.mlp_dim, one.num_heads, one.num_kv_heads) == (16, 2048, 8192, 32, 8)
    assert one.tie_word_embeddings and one.rope_theta == 500000.0 and one.vocab_size == 128256
    assert dict(one.rope_scaling)["factor"] == 32.0
    shape = (seven.num_layers, seven.emb_dim, seven.mlp_dim, seven.num_heads, seven.num_kv_heads)
    assert shape == (32, 4096, 11008, 32, 32)
    assert not seven.tie_word_embeddings and seven.vocab_size == 32000 and seven.rope_scaling is None
    # Exact counts of the shapes (embedding, layers, final norm; plus lm_head when untied).
    assert _count(seven) == 6_738_415_616
    assert _count(one) == 1_235_814_400


def test_exact_count_of_a_small_config():
    c = LlamaConfig(vocab_size=10, emb_dim=8, num_heads=4, num_kv_heads=2, head_dim=2, mlp_dim=6, num_layers=3)
    layer = 8 * 4 * 2 * 2 + 8 * 2 * 2 * 2 + 3 * 8 * 6 + 2 * 8
    tied = 10 * 8 + 3 * layer + 8
    assert count_params(c) == tied
    assert count_params(c.replace(tie_word_embeddings=False)) == tied + 8 * 10
    assert count_params(c.replace(scan_layers=True)) == tied


def test_flops_count_gqa_and_swiglu():
    c = LlamaConfig(vocab_size=100, emb_dim=8, num_heads=4, num_kv_heads=1, head_dim=2, mlp_dim=16, num_layers=3)
    per_layer = 8 * 2 * (4 + 1) * 2 + 3 * 8 * 16  # q, o over 4 heads and k, v over 1; three MLP kernels
    matmul = 3 * per_layer + 8 * 100
    expected = 6 * matmul * 10 + 12 * (4 * 2) * 3 * 10 * 10
    assert flops_per_token(c, {"targets": 10}) * 10 == pytest.approx(expected)
    assert training_flops_per_step(c, 4, {"targets": 10}) == pytest.approx(4 * expected)
    # Multi-head attention costs more than multi-query in the k/v projections only.
    mha = c.replace(num_kv_heads=4)
    assert flops_per_token(mha, {"targets": 10}) - flops_per_token(c, {"targets": 10}) == pytest.approx(
        6 * 3 * 8 * 2 * 2 * 3
    )


def test_llama_7b_flops_per_token_are_about_six_n():
    c = get_preset("llama_7b")
    n_matmul = _count(c) - c.vocab_size * c.emb_dim - (2 * c.num_layers + 1) * c.emb_dim
    per_token = flops_per_token(c, {"targets": 4096})
    attention = 12 * c.num_layers * c.num_heads * c.head_dim * 4096
    assert per_token == pytest.approx(6 * n_matmul + attention)


def test_mixtral_8x7b_shape_and_active_count():
    c = get_preset("mixtral_8x7b")
    shape = (c.num_layers, c.emb_dim, c.mlp_dim, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size)
    assert shape == (32, 4096, 14336, 32, 8, 128, 32000)
    assert not c.tie_word_embeddings and c.rope_theta == 1e6 and c.rms_norm_eps == 1e-5
    assert (c.moe.num_experts, c.moe.top_k, c.moe.every, c.moe.dropless) == (8, 2, 1, True)
    total, active = _count(c), _count(c, active=True)
    assert abs(active / PUBLISHED_ACTIVE_PARAMS["mixtral_8x7b"] - 1) < 0.01, active
    # Exact: embedding and lm_head, final norm; per layer attention (GQA), two norms, the router
    # and 8 (total) or 2 (active) SwiGLU experts.
    attention = 2 * 4096 * 4096 + 2 * 4096 * 1024
    expert = 3 * 4096 * 14336
    outer = 2 * 32000 * 4096 + 4096
    assert total == outer + 32 * (attention + 2 * 4096 + 4096 * 8 + 8 * expert) == 46_702_792_704
    assert active == outer + 32 * (attention + 2 * 4096 + 4096 * 8 + 2 * expert)
    # A dense config's active count is its count; so is Mixtral's when every expert is active.
    assert count_params(get_preset("llama_tiny"), active=True) == count_params(get_preset("llama_tiny"))
    assert _count(c.replace(moe=c.moe.replace(top_k=8)), active=True) == total


def test_mixtral_flops_per_token_are_six_active_n():
    c = get_preset("mixtral_8x7b")
    embedding_and_norms = c.vocab_size * c.emb_dim + (2 * c.num_layers + 1) * c.emb_dim
    per_token = flops_per_token(c, {"targets": 4096})
    attention = 12 * c.num_layers * c.num_heads * c.head_dim * 4096
    assert per_token == pytest.approx(6 * (_count(c, active=True) - embedding_and_norms) + attention)
