"""Hugging Face interchange: transformers' T5ForConditionalGeneration on our exported weights."""

import json
import os

import jax
import numpy as np
import pytest
import torch
import transformers

from cairn.models import EncoderDecoderModel, HFInterchangeError, export_hf, import_hf
from cairn.models.hf_interchange import hf_config


def _random_params(config, seed=0):
    params = EncoderDecoderModel(config).init(jax.random.PRNGKey(seed))
    # Norm scales start at 1: perturb every parameter so that no mapping error can hide.
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
    return jax.tree_util.tree_unflatten(
        treedef, [np.asarray(x + 0.2 * jax.random.normal(k, x.shape)) for x, k in zip(leaves, keys)]
    )


def _batch(config, random_tokens):
    enc = random_tokens(0, (3, 13), config.vocab_size)
    enc[1, 9:] = 0  # padding
    dec = random_tokens(1, (3, 7), config.vocab_size)
    dec[:, 0] = 0  # decoder start token
    return {"encoder_input_tokens": enc, "decoder_input_tokens": dec}


@pytest.mark.parametrize("name", ["t5_1_1", "t5_1_0"])
def test_transformers_logits_match_and_import_is_exact(name, tiny, tmp_path):
    config = getattr(tiny, name)
    model = EncoderDecoderModel(config)
    params = _random_params(config)
    batch = _batch(config, tiny.random_tokens)
    ours = np.asarray(jax.jit(model.apply)(params, batch))
    export_hf(params, config, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]

    hf = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path)).eval()
    assert hf.config.scale_decoder_outputs == config.logits_via_embedding
    with torch.no_grad():
        theirs = hf(
            input_ids=torch.tensor(batch["encoder_input_tokens"], dtype=torch.long),
            attention_mask=torch.tensor(batch["encoder_input_tokens"] > 0, dtype=torch.long),
            decoder_input_ids=torch.tensor(batch["decoder_input_tokens"], dtype=torch.long),
        ).logits.numpy()
    diff = np.abs(ours - theirs).max()
    assert diff < 1e-4, diff
    assert np.abs(ours).max() > 1.0  # the comparison is not between near-zero logits

    imported_config, imported = import_hf(str(tmp_path))
    assert imported_config == config
    flat_a = jax.tree_util.tree_flatten_with_path(params)[0]
    flat_b = jax.tree_util.tree_flatten_with_path(imported)[0]
    assert [p for p, _ in flat_a] == [p for p, _ in flat_b]
    for (path, a), (_, b) in zip(flat_a, flat_b):
        assert np.array_equal(np.asarray(a), b), path


def test_transformers_saved_checkpoint_imports(tiny, tmp_path):
    """A checkpoint written by transformers itself (their layout, their config) loads and agrees."""
    hf_cfg = transformers.T5Config(
        **{k: v for k, v in hf_config(tiny.t5_1_1).items() if k not in ("architectures", "model_type")}
    )
    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(hf_cfg).eval()
    with torch.no_grad():
        hf.lm_head.weight = torch.nn.Parameter(torch.randn_like(hf.shared.weight))
    hf.save_pretrained(str(tmp_path))
    config, params = import_hf(str(tmp_path))
    assert not config.logits_via_embedding and config.mlp_activations == ("gelu", "linear")
    batch = _batch(config, tiny.random_tokens)
    ours = np.asarray(jax.jit(EncoderDecoderModel(config).apply)(params, batch))
    with torch.no_grad():
        theirs = hf(
            input_ids=torch.tensor(batch["encoder_input_tokens"], dtype=torch.long),
            attention_mask=torch.tensor(batch["encoder_input_tokens"] > 0, dtype=torch.long),
            decoder_input_ids=torch.tensor(batch["decoder_input_tokens"], dtype=torch.long),
        ).logits.numpy()
    assert np.abs(ours - theirs).max() < 1e-4


def test_scanned_params_round_trip(tiny, tmp_path):
    config = tiny.t5_1_1.replace(scan_layers=True)
    params = EncoderDecoderModel(config).init(jax.random.PRNGKey(3))
    export_hf(params, config, str(tmp_path))
    _, unscanned = import_hf(str(tmp_path))
    assert "layers_1" in unscanned["encoder"]
    _, scanned = import_hf(str(tmp_path), scan_layers=True)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), params, scanned)


def test_errors_name_the_problem(tiny, tmp_path):
    TINY_T5_1_1 = tiny.t5_1_1
    params = EncoderDecoderModel(TINY_T5_1_1).init(jax.random.PRNGKey(0))
    with pytest.raises(HFInterchangeError, match="mlp_activations"):
        export_hf(params, TINY_T5_1_1.replace(mlp_activations=("linear", "gelu")), str(tmp_path))
    with pytest.raises(FileNotFoundError, match="config.json"):
        import_hf(str(tmp_path / "missing"))
    export_hf(params, TINY_T5_1_1, str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["num_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HFInterchangeError, match="encoder.block.2"):
        import_hf(str(tmp_path))
