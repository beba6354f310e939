"""Hugging Face Mixtral interchange (`cairn.models.llama.hf`): checkpoints written by
transformers 5 (random weights, built offline) import as a `LlamaConfig` with a dropless,
renormalised top-k `moe` and equal logits; our exports load in transformers with equal logits;
greedy decoding matches `generate`; unsupported options and bad tensors are named."""

import json
import os
import shutil

import hf_compare
import jax
import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import save_file

from cairn.models import get_family
from cairn.models.hf_files import HFInterchangeError
from cairn.models.llama import hf as llama_hf
from cairn.models.llama.hf_config import config_from_hf, hf_config

BASE = hf_compare.MIXTRAL
CASES = {
    "gqa_top2": dict(num_experts_per_tok=2, router_aux_loss_coef=0.02, router_jitter_noise=0.1),
    "mqa_top1_tied": dict(num_experts_per_tok=1, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True),
}
TOKENS = np.random.default_rng(0).integers(1, BASE["vocab_size"], (2, 24)).astype(np.int32)


def _build(case: str) -> transformers.MixtralForCausalLM:
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**{**BASE, **CASES[case]})).eval()
    with torch.no_grad():  # larger weights and random norm scales than the default init
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if "norm" not in name else 1.0))
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each case's transformers model (built once) and the directory it saved itself to."""
    out = {}
    for case in CASES:
        model = _build(case)
        directory = str(tmp_path_factory.mktemp(case))
        model.save_pretrained(directory)
        out[case] = (model, directory)
    return out


def _hf_logits(model, tokens=TOKENS) -> np.ndarray:
    return hf_compare.hf_logits(model, tokens)


def _our_logits(config, params, tokens=TOKENS) -> np.ndarray:
    return hf_compare.our_logits(config, params, tokens)


def _close(a, b):
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", sorted(CASES))
def test_imported_logits_equal_transformers(case, saved):
    hf, directory = saved[case]
    with open(os.path.join(directory, "config.json")) as f:
        written = json.load(f)
    assert written["model_type"] == "mixtral" and written["head_dim"] == CASES[case].get("head_dim")
    config, params = llama_hf.import_hf(directory)
    want = _hf_logits(hf)
    assert np.abs(want).max() > 1.0
    _close(_our_logits(config, params), want)
    k = CASES[case]["num_experts_per_tok"]
    moe = config.moe
    assert (moe.num_experts, moe.top_k, moe.dropless, moe.renormalize, moe.every) == (4, k, True, True, 1)
    assert moe.load_balance_loss_weight == CASES[case].get("router_aux_loss_coef", 0.001)
    assert moe.jitter_noise == CASES[case].get("router_jitter_noise", 0.0) and moe.router_z_loss_weight == 0.0
    assert (config.rope_theta, config.rms_norm_eps, config.head_dim) == (1e6, 1e-5, CASES[case].get("head_dim", 8))
    assert config.tie_word_embeddings == ("logits" not in params) == bool(CASES[case].get("tie_word_embeddings"))
    layer = params["layers_1"]["mlp"]
    assert layer["router"]["kernel"].shape == (32, 4) and layer["wo"]["kernel"].shape == (4, 48, 32)
    assert llama_hf.config_from_hf_dir(directory) == config
    if k == 2:  # the comparison sees the routing: without the renormalisation the logits move
        plain = config.replace(moe=moe.replace(renormalize=False))
        assert np.abs(_our_logits(plain, params) - want).max() > 1e-2


def test_sharded_checkpoint_imports_scanned_with_the_family_model_shapes(saved, tmp_path):
    hf, single = saved["gqa_top2"]
    directory = str(tmp_path)
    hf.save_pretrained(directory, max_shard_size="20KB")
    assert "model.safetensors" not in os.listdir(directory)
    assert len([f for f in os.listdir(directory) if f.startswith("model-0")]) > 1
    config, params = llama_hf.import_hf(directory, scan_layers=True)
    mlp = params["layers"]["mlp"]
    assert mlp["router"]["kernel"].shape == (2, 32, 4) and mlp["wi_0"]["kernel"].shape == (2, 4, 32, 48)
    _close(_our_logits(config, params), _hf_logits(hf))
    model = get_family("llama").make_model(llama_hf.config_from_hf_dir(directory, scan_layers=True))
    want = jax.tree_util.tree_map(lambda a: a.shape, jax.eval_shape(model.init, jax.random.PRNGKey(0)))
    assert jax.tree_util.tree_map(np.shape, params) == want  # what launchers' init.hf_checkpoint checks
    unscanned_config, unscanned = llama_hf.import_hf(single)
    a, b = llama_hf.to_hf_state_dict(params, config), llama_hf.to_hf_state_dict(unscanned, unscanned_config)
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def test_fused_in_memory_layout_imports_the_same(saved, tmp_path):
    """transformers 5 holds the experts fused (`mlp.experts.gate_up_proj`), as a raw state dict
    saved with safetensors would store them; `save_pretrained` writes the per-expert layout."""
    hf, directory = saved["gqa_top2"]
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(directory, "config.json"), tmp_path / "config.json")
    config, params = llama_hf.import_hf(str(tmp_path))
    want_config, want = llama_hf.import_hf(directory)
    assert config == want_config
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, want)


@pytest.mark.parametrize("case,shard", [("gqa_top2", None), ("mqa_top1_tied", 30_000)])
def test_export_then_import_is_exact_and_transformers_loads_the_export(case, shard, saved, tmp_path):
    config, params = llama_hf.import_hf(saved[case][1])
    out = str(tmp_path / "out")
    llama_hf.export_hf(params, config, out, max_shard_bytes=shard)
    files = os.listdir(out)
    assert ("model.safetensors.index.json" in files) == (shard is not None)
    with open(os.path.join(out, "config.json")) as f:
        written = json.load(f)
    assert written["architectures"] == ["MixtralForCausalLM"] and written["sliding_window"] is None
    assert "model.layers.1.block_sparse_moe.experts.3.w2.weight" in llama_hf.to_hf_state_dict(params, config)
    again, params2 = llama_hf.import_hf(out)
    assert again == config
    jax.tree_util.tree_map(np.testing.assert_array_equal, params2, params)
    loaded = transformers.MixtralForCausalLM.from_pretrained(out).eval()
    assert (loaded.config.num_local_experts, loaded.config.num_experts_per_tok) == (4, config.moe.top_k)
    _close(_hf_logits(loaded), _our_logits(config, params))


def test_greedy_decoding_equals_transformers_generate(saved):
    """As llama_hf_test, on the gqa_top2 checkpoint (transformers' default `bos_token_id`, 1)."""
    hf, directory = saved["gqa_top2"]
    config, params = llama_hf.import_hf(directory)
    hf_compare.check_greedy_equals_generate(hf, config, params, [[5, 17, 42], [9, 8, 7, 6, 5]], length=14)


def _copy_with_config(directory: str, dest, **changes) -> str:
    shutil.copytree(directory, dest)
    path = os.path.join(dest, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(path, "w") as f:
        json.dump(cfg, f)
    return str(dest)


@pytest.mark.parametrize(
    "changes,message",
    [
        (dict(sliding_window=64), r"sliding_window=64 is not supported"),
        (
            dict(intermediate_size=64),
            r"tensor 'model\.layers\.0\.block_sparse_moe\.experts\.0\.w1\.weight' has shape \[48, 32\], "
            r"config.json implies \[64, 32\]",
        ),
        (dict(num_local_experts=5), r"tensor 'model\.layers\.0\.block_sparse_moe\.gate\.weight' has shape \[4, 32\]"),
        (dict(num_experts_per_tok=5), r"num_experts_per_tok \(5\) must be <= num_local_experts \(4\)"),
        (dict(architectures=["LlamaForCausalLM"]), "not a LlamaForCausalLM or MixtralForCausalLM checkpoint"),
        (dict(hidden_act="gelu"), "hidden_act='gelu' is not supported"),
    ],
)
def test_bad_checkpoints_are_named(changes, message, saved, tmp_path):
    directory = _copy_with_config(saved["gqa_top2"][1], tmp_path / "bad", **changes)
    with pytest.raises(HFInterchangeError, match=message):
        llama_hf.import_hf(directory)


@pytest.mark.parametrize(
    "moe,message",
    [
        (dict(dropless=False), r"moe\.dropless=False has no MixtralForCausalLM equivalent .*routes every token"),
        (dict(routing="expert_choice"), r"moe\.routing='expert_choice' has no MixtralForCausalLM equivalent"),
        (dict(renormalize=False), r"moe\.renormalize=False has no MixtralForCausalLM equivalent"),
        (dict(every=2), r"moe\.every=2 has no MixtralForCausalLM equivalent"),
    ],
)
def test_export_refuses_what_mixtral_cannot_compute(moe, message, saved, tmp_path):
    config, params = llama_hf.import_hf(saved["gqa_top2"][1])
    bad = config.replace(moe=config.moe.replace(**moe))
    with pytest.raises(HFInterchangeError, match=message):
        llama_hf.export_hf(params, bad, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")  # refused before anything is written


def test_config_defaults_follow_transformers_mixtral():
    c = config_from_hf(
        {
            "model_type": "mixtral",
            "vocab_size": 10,
            "hidden_size": 8,
            "intermediate_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "head_dim": None,
            "sliding_window": None,
        }
    )
    defaults = transformers.MixtralConfig()
    assert (c.rope_theta, c.rms_norm_eps, c.tie_word_embeddings) == (1e6, defaults.rms_norm_eps, False)
    assert (c.num_kv_heads, c.head_dim) == (2, 4)
    assert (c.moe.num_experts, c.moe.top_k) == (defaults.num_local_experts, defaults.num_experts_per_tok)
    assert c.moe.load_balance_loss_weight == defaults.router_aux_loss_coef
    written = hf_config(c.replace(moe=c.moe.replace(expert_mlp_dim=24)))
    assert (written["intermediate_size"], written["max_position_embeddings"]) == (24, 4096 * 32)
