"""The chunked cross-entropy (`loss_chunk_size`) equals the whole-logits loss, metrics and
gradients; the whole float32 logits tensor is gone from the compiled loss + gradient; and
`param_dtype` stores every family's parameters in bfloat16."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cairn.models import (
    DecoderOnlyConfig,
    DecoderOnlyModel,
    EncoderDecoderModel,
    LlamaConfig,
    MoeConfig,
    T5Config,
    chunked_loss,
    losses,
)
from cairn.models.model_base import chunked_loss_and_metrics, loss_and_metrics

LLAMA = LlamaConfig(
    vocab_size=67, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=48, num_layers=2, init_std=0.2
)
OPTIONS = dict(label_smoothing=0.1, z_loss=1e-2, loss_normalizing_factor=losses.AVERAGE_PER_SEQUENCE)


def _batch(seed: int, b: int, length: int, vocab: int, encoder: bool = False) -> dict:
    """Targets with padding, fractional loss weights and two packed sequences in one row."""
    rng = np.random.default_rng(seed)
    targets = rng.integers(2, vocab, (b, length)).astype(np.int32)
    targets[1, length - 3 :] = 0
    weights = (targets > 0).astype(np.float32)
    weights[0, 1] = 0.5
    segments = (targets > 0).astype(np.int32)
    segments[2, length // 2 :] = 2
    batch = {
        "decoder_input_tokens": np.roll(targets, 1, axis=1),
        "decoder_target_tokens": targets,
        "decoder_loss_weights": weights,
        "decoder_segment_ids": segments,
    }
    if encoder:
        batch["encoder_input_tokens"] = rng.integers(2, vocab, (b, 6)).astype(np.int32)
    return batch


def _assert_trees_close(a, b, rtol=2e-5):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * float(np.max(np.abs(x)) + 1e-30))


@pytest.mark.parametrize("tied", [True, False])
def test_every_normalizing_mode_matches_the_whole_logits(tied):
    """Metrics and gradients w.r.t. hidden states and projection; uneven chunks (7 positions in
    chunks of 3, padded to 9); some targets are the argmax, so the accuracy is not 0."""
    b, length, e, v = 3, 7, 8, 29
    rng = np.random.default_rng(1)
    hidden = rng.standard_normal((b, length, e)).astype(np.float32)
    kernel = rng.standard_normal((v, e) if tied else (e, v)).astype(np.float32)
    batch = _batch(2, b, length, v)
    logits = chunked_loss.Unembedding(hidden, kernel, tied).logits()
    hit = np.asarray(jnp.argmax(logits, -1))
    targets = np.where(rng.random((b, length)) < 0.5, hit, batch["decoder_target_tokens"])
    batch["decoder_target_tokens"] = np.where(batch["decoder_target_tokens"] > 0, targets, 0).astype(np.int32)
    assert chunked_loss.chunk_layout(b, length, 9) == (3, 3)

    def run(mode):
        def whole(h, k):
            return loss_and_metrics(chunked_loss.Unembedding(h, k, tied).logits(), batch, 0.1, 1e-2, mode)

        def chunked(h, k):
            return chunked_loss_and_metrics(chunked_loss.Unembedding(h, k, tied), batch, 0.1, 1e-2, mode, 9)

        return [jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(hidden, kernel) for f in (whole, chunked)]

    modes = (None, 3.0, *losses.NORMALIZING_MODES) if tied else (losses.AVERAGE_PER_SEQUENCE,)
    results = jax.jit(lambda: [run(mode) for mode in modes])()  # one compile
    for mode, (((_, want), want_grads), ((_, got), got_grads)) in zip(modes, results, strict=True):
        assert set(got) == set(want) and float(want["accuracy"]) > 0.2, (mode, want)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=2e-6, err_msg=f"{mode} {name}")
        _assert_trees_close(got_grads, want_grads)


def test_aligned_chunks_on_a_tpu(monkeypatch):
    """On a TPU a chunk's positions are a multiple of 16 (no relayout when its logits flatten):
    the layout chosen, and the loss and gradient with aligned, padded chunks (here 4 on CPU)."""
    assert chunked_loss.chunk_layout(12, 2048, 2048, 16) == (16, 128)  # not 13 x 158
    assert chunked_loss.chunk_layout(16, 114, 2048, 16) == (1, 128)
    assert chunked_loss.chunk_layout(3, 7, 9, 16) == (3, 3)  # shorter than the alignment
    b, length, e, v = 3, 7, 8, 29
    rng = np.random.default_rng(2)
    hidden = rng.standard_normal((b, length, e)).astype(np.float32)
    kernel = rng.standard_normal((e, v)).astype(np.float32)
    batch = _batch(3, b, length, v)

    def loss(h, k, chunked):
        head = chunked_loss.Unembedding(h, k, False)
        if chunked:
            return chunked_loss_and_metrics(head, batch, 0.1, 1e-2, None, 9)[0]
        return loss_and_metrics(head.logits(), batch, 0.1, 1e-2, None)[0]

    want = jax.value_and_grad(loss, argnums=(0, 1))(hidden, kernel, False)
    monkeypatch.setattr(chunked_loss, "_align", lambda: 4)
    assert chunked_loss.chunk_layout(b, length, 9, 4) == (2, 4)  # 8 positions, one padded
    got = jax.value_and_grad(loss, argnums=(0, 1))(hidden, kernel, True)
    np.testing.assert_allclose(got[0], want[0], rtol=2e-6)
    _assert_trees_close(got[1], want[1])


def _models():
    t5 = T5Config(
        vocab_size=67,
        emb_dim=32,
        num_heads=4,
        head_dim=8,
        mlp_dim=48,
        num_encoder_layers=1,
        num_decoder_layers=1,
        logits_via_embedding=False,
    )
    # T5.1.0-style tied and rescaled logits, with a routed MLP.
    decoder = DecoderOnlyConfig(
        vocab_size=67,
        emb_dim=32,
        num_heads=4,
        head_dim=8,
        mlp_dim=48,
        num_layers=1,
        logits_via_embedding=True,
        moe=MoeConfig(num_experts=2, top_k=1),
    )
    return {
        "t5": (EncoderDecoderModel, t5),
        "decoder_only_moe": (DecoderOnlyModel, decoder),
        "llama": (DecoderOnlyModel, LLAMA.replace(num_layers=1)),
    }


@pytest.mark.parametrize("name", ["t5", "decoder_only_moe", "llama"])
def test_models_train_the_same_with_a_chunked_loss(name, tiny):
    cls, config = _models()[name]
    whole = cls(config, **OPTIONS)
    chunked = cls(config.replace(loss_chunk_size=8), **OPTIONS)
    params = tiny.random_params(whole)
    batch = _batch(3, 3, 10, config.vocab_size, encoder=cls is EncoderDecoderModel)

    def both(params):
        return [jax.value_and_grad(m.loss_fn, has_aux=True)(params, batch) for m in (whole, chunked)]

    ((_, want), want_grads), ((_, got), got_grads) = jax.jit(both)(params)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=2e-6, err_msg=key)
    _assert_trees_close(got_grads, want_grads)


def test_the_whole_logits_tensor_is_gone():
    """The compiled loss + gradient (w.r.t. hidden states and a tied projection) of 4 x 128
    tokens over 8192 words: its temporaries exceed `tokens * vocab * 4` bytes with whole
    logits, and stay under it in chunks of 64 tokens."""
    b, length, e, v = 4, 128, 32, 8192
    batch = _batch(4, b, length, v)
    hidden = jax.ShapeDtypeStruct((b, length, e), jnp.float32)
    table = jax.ShapeDtypeStruct((v, e), jnp.float32)
    options = (0.1, 1e-2, losses.AVERAGE_PER_SEQUENCE)

    def whole(h, k):
        return loss_and_metrics(chunked_loss.Unembedding(h, k, True).logits(), batch, *options)

    def chunked(h, k):
        return chunked_loss_and_metrics(chunked_loss.Unembedding(h, k, True), batch, *options, 64)

    def temp_bytes(f) -> int:
        grad = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))
        return grad.lower(hidden, table).compile().memory_analysis().temp_size_in_bytes

    logits_bytes = b * length * v * 4  # 16 MiB of float32 logits
    got = {"whole": temp_bytes(whole), "chunked": temp_bytes(chunked)}
    print(f"temp bytes: {got}, tokens * vocab * 4 = {logits_bytes}")
    assert got["whole"] >= logits_bytes > got["chunked"], got


@pytest.mark.parametrize("family", ["t5", "decoder_only"])
def test_bfloat16_parameters(family, tiny):
    """Every parameter in bfloat16 (the MoE router aside: float32 by design; a float32 config's
    stay float32). T5: finite float32 logits; decoder-only: a finite training step (chunked
    loss) with bfloat16 gradients."""
    t5 = tiny.t5_1_1.replace(num_encoder_layers=1, num_decoder_layers=1, scan_layers=True)
    cls, config = {"t5": (EncoderDecoderModel, t5), "decoder_only": (DecoderOnlyModel, tiny.decoder_only)}[family]
    shapes = jax.eval_shape(cls(config).init, jax.random.PRNGKey(0))
    assert {str(x.dtype) for x in jax.tree_util.tree_leaves(shapes)} == {"float32"}
    model = cls(config.replace(param_dtype="bfloat16", dtype="bfloat16", loss_chunk_size=16))
    params = tiny.random_params(model)
    assert {str(x.dtype) for x in jax.tree_util.tree_leaves(params)} == {"bfloat16"}
    batch = _batch(5, 3, 8, config.vocab_size, encoder=cls is EncoderDecoderModel)
    if family == "t5":
        logits = jax.jit(model.apply)(params, batch)
        assert logits.dtype == jnp.float32 and logits.shape == (3, 8, config.vocab_size)
        assert np.all(np.isfinite(logits)) and float(jnp.std(logits)) > 0
        return
    (loss, metrics), grads = jax.jit(jax.value_and_grad(model.loss_fn, has_aux=True))(params, batch)
    assert np.isfinite(float(loss)) and float(loss) > 0 and float(metrics["weight_sum"]) > 0
    assert {str(x.dtype) for x in jax.tree_util.tree_leaves(grads)} == {"bfloat16"}
    assert all(np.all(np.isfinite(np.asarray(g, np.float32))) for g in jax.tree_util.tree_leaves(grads))


@pytest.mark.parametrize(
    "changes,message",
    [
        (dict(param_dtype="int8"), "T5Config.param_dtype must be float32, bfloat16 or float16"),
        (dict(loss_chunk_size=-1), r"T5Config.loss_chunk_size must be an int >= 0"),
        (dict(loss_chunk_size=2.5), r"T5Config.loss_chunk_size must be an int >= 0"),
    ],
)
def test_bad_config_values_are_named(changes, message, tiny):
    with pytest.raises(ValueError, match=message):
        tiny.t5_1_1.replace(**changes)
    with pytest.raises(ValueError, match=message.replace("T5Config", "DecoderOnlyConfig")):
        tiny.decoder_only.replace(**changes)
