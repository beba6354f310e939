"""Hugging Face Llama interchange: checkpoints written by transformers 5 (random weights, built
offline) import with equal logits, our exports load in transformers with equal logits, both
config.json layouts read alike, greedy decoding matches `generate`, and bad input is named."""

import json
import os

import hf_compare
import jax
import numpy as np
import pytest
import torch
import transformers

from cairn.models import get_family
from cairn.models.hf_files import HFInterchangeError
from cairn.models.llama import hf as llama_hf
from cairn.models.llama.hf_config import config_from_hf

BASE = hf_compare.LLAMA
SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}


def _hf_model(**changes) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**BASE, **changes})).eval()
    with torch.no_grad():  # larger weights and random norm scales than the default init
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if "norm" not in name else 1.0))
    return model


def _save(model, directory, **kwargs) -> str:
    model.save_pretrained(str(directory), **kwargs)
    return str(directory)


TOKENS = np.random.default_rng(0).integers(1, BASE["vocab_size"], (2, 40)).astype(np.int32)


def _hf_logits(model, tokens=TOKENS) -> np.ndarray:
    return hf_compare.hf_logits(model, tokens)


def _our_logits(config, params, tokens=TOKENS) -> np.ndarray:
    return hf_compare.our_logits(config, params, tokens)


CASES = {
    "gqa_untied": dict(),
    "mqa_tied": dict(num_key_value_heads=1, tie_word_embeddings=True),
    "mha_theta": dict(num_key_value_heads=4, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    "llama3": dict(rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, **SCALING}),
    "head_dim": dict(head_dim=16, tie_word_embeddings=True),  # 4 heads * 16 != 32 hidden
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_imported_logits_equal_transformers(case, tmp_path):
    hf = _hf_model(**CASES[case])
    config, params = llama_hf.import_hf(_save(hf, tmp_path))
    want = _hf_logits(hf)
    assert np.abs(want).max() > 1.0
    np.testing.assert_allclose(_our_logits(config, params), want, atol=1e-4, rtol=1e-4)
    assert config.tie_word_embeddings == bool(CASES[case].get("tie_word_embeddings", False))
    assert ("logits" in params) != config.tie_word_embeddings
    if case == "head_dim":
        assert config.head_dim == 16 and config.emb_dim == 32
    if case == "llama3":
        assert dict(config.rope_scaling) == SCALING
    assert llama_hf.config_from_hf_dir(str(tmp_path)) == config


def test_sharded_checkpoint_imports_and_scans(tmp_path):
    hf = _hf_model()
    directory = _save(hf, tmp_path, max_shard_size="20KB")
    assert "model.safetensors" not in os.listdir(directory) and "model.safetensors.index.json" in os.listdir(directory)
    assert len([f for f in os.listdir(directory) if f.startswith("model-0")]) > 1
    config, params = llama_hf.import_hf(directory, scan_layers=True)
    assert config.scan_layers and params["layers"]["attention"]["key"]["kernel"].shape == (2, 32, 2, 8)
    np.testing.assert_allclose(_our_logits(config, params), _hf_logits(hf), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case,shard", [("gqa_untied", None), ("mqa_tied", 30_000), ("llama3", 30_000)])
def test_export_then_import_is_exact_and_transformers_loads_the_export(case, shard, tmp_path):
    config, params = llama_hf.import_hf(_save(_hf_model(**CASES[case]), tmp_path / "in"))
    out = str(tmp_path / "out")
    llama_hf.export_hf(params, config, out, max_shard_bytes=shard)
    files = os.listdir(out)
    assert ("model.safetensors.index.json" in files) == (shard is not None)
    again, params2 = llama_hf.import_hf(out)
    assert again == config
    jax.tree_util.tree_map(np.testing.assert_array_equal, params2, params)
    loaded = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    assert loaded.config.tie_word_embeddings == config.tie_word_embeddings
    np.testing.assert_allclose(_hf_logits(loaded), _our_logits(config, params), atol=1e-4, rtol=1e-4)


def test_export_of_scanned_params_writes_the_same_tensors(tmp_path):
    config, params = llama_hf.import_hf(_save(_hf_model(), tmp_path / "in"))
    scanned_config, scanned = llama_hf.import_hf(str(tmp_path / "in"), scan_layers=True)
    a, b = llama_hf.to_hf_state_dict(params, config), llama_hf.to_hf_state_dict(scanned, scanned_config)
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def _v4_layout(directory: str) -> None:
    """Rewrites config.json as transformers 4 wrote it: top-level rope_theta and rope_scaling
    (with `type`, and no original_max_position_embeddings: max_position_embeddings is used)."""
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    rope.pop("original_max_position_embeddings", None)
    kind = rope.pop("rope_type")
    cfg["rope_scaling"] = None if kind == "default" else {"type": kind, **rope}
    with open(path, "w") as f:
        json.dump(cfg, f)


@pytest.mark.parametrize("case", ["mha_theta", "llama3"])
def test_transformers_4_config_layout_imports_the_same(case, tmp_path):
    changes = dict(CASES[case])
    if case == "llama3":  # v4 layout falls back to max_position_embeddings: make them agree
        changes["max_position_embeddings"] = SCALING["original_max_position_embeddings"]
    directory = _save(_hf_model(**changes), tmp_path)
    want_config, want_params = llama_hf.import_hf(directory)
    _v4_layout(directory)
    with open(os.path.join(directory, "config.json")) as f:
        assert "rope_parameters" not in json.load(f)
    config, params = llama_hf.import_hf(directory)
    assert config == want_config
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, want_params)


def test_greedy_decoding_equals_transformers_generate(tmp_path):
    """The checkpoint's `bos_token_id` (3) is imported as the prompt start: greedy decoding of the
    prompt as the tokenizer produced it equals `generate` (`hf_compare.check_greedy_equals_generate`)."""
    hf = _hf_model(bos_token_id=3)
    config, params = llama_hf.import_hf(_save(hf, tmp_path))
    prompts = [[5, 17, 42], [9, 8, 7, 6, 5, 4], [77]]
    # 30 tokens: the cache (36 positions) takes two of `attend_written`'s prefixes (32, 36)
    hf_compare.check_greedy_equals_generate(hf, config, params, prompts, length=30)


def _write_config(directory, **changes):
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(path, "w") as f:
        json.dump(cfg, f)


@pytest.mark.parametrize(
    "changes,message",
    [
        (
            dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}),
            r"rope_parameters\.rope_type='yarn'",
        ),
        (
            dict(rope_parameters=None, rope_scaling={"type": "linear", "factor": 2.0}),
            r"rope_scaling\.rope_type='linear'",
        ),
        (dict(attention_bias=True), "attention_bias=True is not supported"),
        (dict(mlp_bias=True), "mlp_bias=True is not supported"),
        (dict(hidden_act="gelu"), "hidden_act='gelu' is not supported"),
        (dict(num_key_value_heads=3), r"num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)"),
        (
            dict(architectures=["MistralForCausalLM"], model_type="mistral"),
            "not a LlamaForCausalLM or MixtralForCausalLM checkpoint",
        ),
        (dict(intermediate_size=64), r"tensor 'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \[48, 32\]"),
        (
            dict(num_attention_heads=2, num_key_value_heads=2, head_dim=None),
            r"tensor 'model\.layers\.0\.self_attn\.k_proj\.weight' has shape \[16, 32\], "
            r"config.json implies \[32, 32\]",
        ),
        (dict(tie_word_embeddings=True), "lm_head.weight differs"),
        (dict(num_hidden_layers=3), r"no tensor 'model\.layers\.2\.input_layernorm\.weight'"),
    ],
)
def test_bad_checkpoints_are_named(changes, message, tmp_path):
    directory = _save(_hf_model(), tmp_path)
    _write_config(directory, **changes)
    with pytest.raises(HFInterchangeError, match=message):
        llama_hf.import_hf(directory)


def test_untied_config_without_lm_head_and_missing_files_are_named(tmp_path):
    directory = _save(_hf_model(tie_word_embeddings=True), tmp_path / "tied")
    _write_config(directory, tie_word_embeddings=False)
    with pytest.raises(HFInterchangeError, match="no tensor 'lm_head.weight'"):
        llama_hf.import_hf(directory)
    os.remove(os.path.join(directory, "model.safetensors"))
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor model.safetensors.index.json"):
        llama_hf.import_hf(directory)
    with pytest.raises(FileNotFoundError, match="config.json does not exist"):
        llama_hf.config_from_hf_dir(str(tmp_path))


def test_config_defaults_and_bfloat16_weights(tmp_path):
    c = config_from_hf(
        {"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}
    )
    assert (c.num_kv_heads, c.head_dim, c.rope_theta, c.rope_scaling, c.tie_word_embeddings) == (2, 4, 1e4, None, False)
    hf = _hf_model(tie_word_embeddings=True).to(torch.bfloat16)
    config, params = llama_hf.import_hf(_save(hf, tmp_path))
    emb = hf.model.embed_tokens.weight.float().detach().numpy()
    np.testing.assert_array_equal(params["token_embedder"]["embedding"], emb)
    assert params["token_embedder"]["embedding"].dtype == np.float32


@pytest.mark.parametrize("scan", [False, True])
def test_imported_tree_has_the_shapes_of_the_family_model(scan, tmp_path):
    """What the launchers' `init.hf_checkpoint` checks: `config_from_hf_dir`'s model, initialised,
    has exactly the imported tree's shapes."""
    directory = _save(_hf_model(head_dim=16), tmp_path)
    config = llama_hf.config_from_hf_dir(directory, scan_layers=scan)
    model = get_family("llama").make_model(config)
    want = jax.tree_util.tree_map(lambda a: a.shape, jax.eval_shape(model.init, jax.random.PRNGKey(0)))
    _, params = llama_hf.import_hf(directory, scan_layers=scan)
    assert jax.tree_util.tree_map(np.shape, params) == want
