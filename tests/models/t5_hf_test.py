"""Hugging Face interchange: transformers' T5ForConditionalGeneration on our exported weights."""

import json
import os

import jax
import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open

from cairn.models import EncoderDecoderModel, HFInterchangeError, export_hf, import_hf
from cairn.models.t5.hf import config_from_hf, config_from_hf_dir, hf_config


def _random_params(config, seed=0):
    """Parameters of the init's tree, every one random (numpy; nothing compiled): norm scales
    1 + normal(0, 0.2), so that no mapping error can hide; the embedding normal(0, 1), as T5
    initialises it, the rest normal(0, 0.2)."""
    shapes = jax.eval_shape(EncoderDecoderModel(config).init, jax.random.PRNGKey(seed))
    rng = np.random.default_rng(seed)

    def draw(path, x):
        name = jax.tree_util.keystr(path)
        base = 1.0 if "scale" in name else 0.0
        std = 1.0 if "embedding" in name else 0.2
        return (base + std * rng.standard_normal(x.shape)).astype(x.dtype)

    return jax.tree_util.tree_map_with_path(draw, shapes)


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
    theirs = _hf_logits(hf, batch)
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


def _hf_logits(hf, batch) -> np.ndarray:
    with torch.no_grad():
        return hf(
            input_ids=torch.tensor(batch["encoder_input_tokens"], dtype=torch.long),
            attention_mask=torch.tensor(batch["encoder_input_tokens"] > 0, dtype=torch.long),
            decoder_input_ids=torch.tensor(batch["decoder_input_tokens"], dtype=torch.long),
        ).logits.numpy()


GATED = {"feed_forward_proj": "gated-gelu"}
# name: (transformers model class, config kwargs, own lm_head, (logits_via_embedding, scale_tied_logits)).
SAVED_BY_TRANSFORMERS = {
    "mt5_tied": (transformers.MT5ForConditionalGeneration, GATED, False, (True, False)),
    "mt5_untied": (transformers.MT5ForConditionalGeneration, GATED, True, (False, True)),
    # transformers 5 ties it (tie_word_embeddings=False only turns the rescale off).
    "t5_1_1_tied_unscaled": (
        transformers.T5ForConditionalGeneration,
        {**GATED, "tie_word_embeddings": False},
        False,
        (True, False),
    ),
    "t5_1_1_untied": (
        transformers.T5ForConditionalGeneration,
        {**GATED, "tie_word_embeddings": False},
        True,
        (False, True),
    ),
    "t5_1_0_tied": (transformers.T5ForConditionalGeneration, {"feed_forward_proj": "relu"}, False, (True, True)),
    # Untied but rescaled: the scale is folded into our logits kernel.
    "t5_1_0_untied_scaled": (
        transformers.T5ForConditionalGeneration,
        {"feed_forward_proj": "relu"},
        True,
        (False, True),
    ),
}


def _saved_by_transformers(name, tiny, directory):
    model_class, kwargs, own_head, _ = SAVED_BY_TRANSFORMERS[name]
    base = {
        k: v
        for k, v in hf_config(tiny.t5_1_1).items()
        if k not in ("architectures", "model_type", "tie_word_embeddings", "scale_decoder_outputs", "feed_forward_proj")
    }
    mt5 = model_class is transformers.MT5ForConditionalGeneration
    config_class = transformers.MT5Config if mt5 else transformers.T5Config
    torch.manual_seed(0)
    hf = model_class(config_class(**{**base, "dropout_rate": 0.125, **kwargs})).eval()
    with torch.no_grad():
        if own_head:
            hf.lm_head.weight = torch.nn.Parameter(torch.randn_like(hf.shared.weight))
        for p in hf.parameters():  # norm scales start at 1: perturb everything
            p.add_(0.2 * torch.randn_like(p))
        # Unscaled heads on std-1 weights give logits near 20, where transformers' own
        # float32 rounding (2e-4 from float64) exceeds the 1e-4 asked; a smaller embedding keeps
        # them near 5 (ours stays within 7e-5 of float64 either way).
        if not getattr(hf.config, "scale_decoder_outputs", False):
            for w in {id(w): w for w in (hf.shared.weight, hf.lm_head.weight)}.values():
                w.mul_(0.25)
    assert (hf.lm_head.weight is hf.shared.weight) != own_head
    hf.save_pretrained(str(directory))
    return hf


@pytest.mark.parametrize("name", sorted(SAVED_BY_TRANSFORMERS))
def test_checkpoint_saved_by_transformers_5_imports(name, tiny, tmp_path):
    """A checkpoint written by transformers 5 itself (its layout, its config.json) imports with
    the right head, gives transformers' logits, and exports back exactly."""
    hf = _saved_by_transformers(name, tiny, tmp_path / "hf")
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert saved["tie_word_embeddings"] is True  # transformers 5 always writes true
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "np") as f:
        assert ("lm_head.weight" in f.keys()) == SAVED_BY_TRANSFORMERS[name][2]

    config, params = import_hf(str(tmp_path / "hf"))
    tied, scaled = SAVED_BY_TRANSFORMERS[name][3]
    acts = ("relu",) if "t5_1_0" in name else ("gelu", "linear")
    expected = tiny.t5_1_1.replace(
        mlp_activations=acts, logits_via_embedding=tied, scale_tied_logits=scaled, dropout_rate=0.125
    )
    assert config == expected
    assert config_from_hf_dir(str(tmp_path / "hf")) == config
    assert ("logits" in params["decoder"]) != tied

    batch = _batch(config, tiny.random_tokens)
    ours = np.asarray(jax.jit(EncoderDecoderModel(config).apply)(params, batch))
    theirs = _hf_logits(hf, batch)
    assert np.abs(ours).max() > 1.0
    assert np.abs(ours - theirs).max() < 1e-4, np.abs(ours - theirs).max()

    export_hf(params, config, str(tmp_path / "ours"))
    again_config, again = import_hf(str(tmp_path / "ours"))
    assert again_config == config
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(a, b), params, again)
    reloaded = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "ours")).eval()
    assert np.abs(_hf_logits(reloaded, batch) - theirs).max() < 1e-4


def test_scanned_params_round_trip(tiny, tmp_path):
    config = tiny.t5_1_1.replace(scan_layers=True)
    params = _random_params(config, seed=3)
    export_hf(params, config, str(tmp_path))
    _, unscanned = import_hf(str(tmp_path))
    assert "layers_1" in unscanned["encoder"]
    _, scanned = import_hf(str(tmp_path), scan_layers=True)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), params, scanned)


def test_errors_name_the_problem(tiny, tmp_path):
    TINY_T5_1_1 = tiny.t5_1_1
    params = _random_params(TINY_T5_1_1)
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
    export_hf(params, TINY_T5_1_1, str(tmp_path))
    with pytest.raises(HFInterchangeError, match="lm_head.weight differs from shared.weight"):
        import_hf(str(tmp_path), logits_via_embedding=True)
    (tmp_path / "model.safetensors").write_bytes(b"\x07")
    with pytest.raises(ValueError, match="not a safetensors file"):
        config_from_hf_dir(str(tmp_path))


def test_config_from_hf_reads_the_flags(tiny):
    """`config.json` alone: dropout, mT5's unscaled head, transformers 4's `tie_word_embeddings`."""
    hf = {k: v for k, v in hf_config(tiny.t5_1_1).items() if k not in ("tie_word_embeddings", "scale_decoder_outputs")}
    assert config_from_hf({**hf, "dropout_rate": 0.3}).dropout_rate == 0.3
    assert config_from_hf({k: v for k, v in hf.items() if k != "dropout_rate"}).dropout_rate == 0.1
    v4_untied = config_from_hf({**hf, "tie_word_embeddings": False})
    assert not v4_untied.logits_via_embedding
    v4_tied = config_from_hf(hf)
    assert v4_tied.logits_via_embedding and v4_tied.scale_tied_logits
    mt5 = config_from_hf({**hf, "model_type": "mt5"})
    assert mt5.logits_via_embedding and not mt5.scale_tied_logits
    t5_unscaled = config_from_hf({**hf, "tie_word_embeddings": True, "scale_decoder_outputs": False})
    assert t5_unscaled.logits_via_embedding and not t5_unscaled.scale_tied_logits
    assert not config_from_hf({**hf, "model_type": "mt5"}, tied=False).logits_via_embedding
