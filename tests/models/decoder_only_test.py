"""The decoder-only network and DecoderOnlyModel: packing, prefix LM, decoding with a cache."""

import functools

import jax
import numpy as np
import pytest

from cairn.models import DecodeOptions, DecoderOnlyModel, count_params


@pytest.fixture(scope="module")
def model_and_params(tiny):
    model = DecoderOnlyModel(tiny.decoder_only)
    return model, tiny.random_params(model)


def _lm_batch(tokens):
    tokens = np.asarray(tokens, np.int32)
    return {
        "decoder_input_tokens": np.pad(tokens[:, :-1], ((0, 0), (1, 0))),
        "decoder_target_tokens": tokens,
        "decoder_loss_weights": (tokens > 0).astype(np.float32),
    }


def test_packed_loss_equals_unpacked(tiny, model_and_params):
    _, params = model_and_params
    model = DecoderOnlyModel(tiny.decoder_only, z_loss=1e-3, label_smoothing=0.1)
    a, b = tiny.random_tokens(1, (5,), 67), tiny.random_tokens(2, (4,), 67)
    packed = _lm_batch(np.concatenate([a, b, [0]])[None])
    packed["decoder_input_tokens"][0, 5] = 0  # each segment starts from BOS
    packed["decoder_segment_ids"] = np.array([[1] * 5 + [2] * 4 + [0]], np.int32)
    loss_fn = jax.jit(model.loss_fn)
    # Each sequence alone, right-padded to the packed row's length (one compiled loss: causal,
    # so the padding after a sequence changes none of its positions, and it weighs 0).
    alone = [_lm_batch(np.pad(x, (0, 10 - len(x)))[None]) for x in (a, b)]
    expected = sum(float(loss_fn(params, batch)[0]) for batch in alone)
    np.testing.assert_allclose(loss_fn(params, packed)[0], expected, rtol=1e-5)


def test_prefix_lm_attends_bidirectionally_over_inputs(model_and_params, tiny):
    model, params = model_and_params
    tokens = tiny.random_tokens(3, (1, 8), 67)
    batch = _lm_batch(tokens)
    apply = jax.jit(model.apply)
    causal = np.asarray(apply(params, batch))
    prefix = dict(batch, decoder_causal_attention=np.array([[1, 1, 1, 1, 0, 0, 0, 0]], np.int32))
    changed = dict(prefix, decoder_input_tokens=batch["decoder_input_tokens"].copy())
    changed["decoder_input_tokens"][0, 3] = 7
    with_prefix, with_change = np.asarray(apply(params, prefix)), np.asarray(apply(params, changed))
    assert not np.allclose(with_prefix[0, 0], causal[0, 0])  # position 0 now sees the whole prefix
    assert not np.allclose(with_change[0, 0], with_prefix[0, 0])  # ... including position 3
    after = dict(prefix, decoder_input_tokens=batch["decoder_input_tokens"].copy())
    after["decoder_input_tokens"][0, 6] = 7  # a target position: still invisible to earlier ones
    np.testing.assert_allclose(np.asarray(apply(params, after))[0, :6], with_prefix[0, :6], atol=1e-6)


def _predict(model, params, prompts, **options):
    fn = jax.jit(functools.partial(model.predict_batch, options=DecodeOptions(max_decode_length=9, **options)))
    return jax.tree_util.tree_map(np.asarray, fn(params, prompts, rng=jax.random.PRNGKey(0)))


def test_decoding_with_cache_equals_without_and_keeps_the_prompt(model_and_params, tiny):
    model, params = model_and_params
    prompts = np.zeros((2, 4), np.int32)
    prompts[0, :3] = tiny.random_tokens(4, (3,), 67)
    prompts[1, :1] = 9
    cached, s1 = _predict(model, params, prompts)
    plain, s2 = _predict(model, params, prompts, use_cache=False)
    np.testing.assert_array_equal(cached, plain)
    np.testing.assert_allclose(s1, s2, rtol=1e-5)
    np.testing.assert_array_equal(cached[0, :3], prompts[0, :3])
    assert cached[1, 0] == 9


def test_beam_search_unscanned_cache_equals_no_cache(model_and_params):
    """Prompts of width 0 and a length penalty. (One beam == greedy, a property of the decoding
    loop whatever the family: prefill_decoding_test's `test_top_k_one_and_one_beam_are_greedy`.)"""
    model, params = model_and_params
    empty = np.zeros((2, 0), np.int32)
    cached, scores = _predict(model, params, empty, method="beam", num_beams=3, alpha=0.6)
    plain, plain_scores = _predict(model, params, empty, method="beam", num_beams=3, alpha=0.6, use_cache=False)
    np.testing.assert_array_equal(cached, plain)
    np.testing.assert_allclose(scores, plain_scores, rtol=1e-5)
    with pytest.raises(NotImplementedError, match="prefill"):
        model.predict_batch(params, np.ones((2, 3), np.int32), DecodeOptions(method="beam", prefill=False))


def test_count_params_of_the_tiny_config(tiny):
    c = tiny.decoder_only
    layer = 4 * c.emb_dim * c.num_heads * c.head_dim + 3 * c.emb_dim * c.mlp_dim + 2 * c.emb_dim
    expected = 2 * c.vocab_size * c.emb_dim + c.num_heads * 32 + c.num_layers * layer + c.emb_dim
    assert count_params(c) == expected


def test_tied_logits_are_rescaled_only_with_scale_tied_logits(tiny):
    config = tiny.decoder_only.replace(logits_via_embedding=True)
    params = tiny.random_params(DecoderOnlyModel(config), seed=4)
    batch = _lm_batch(tiny.random_tokens(5, (2, 6), 67))
    scaled = np.asarray(jax.jit(DecoderOnlyModel(config).apply)(params, batch))
    unscaled = np.asarray(jax.jit(DecoderOnlyModel(config.replace(scale_tied_logits=False)).apply)(params, batch))
    np.testing.assert_allclose(unscaled, scaled * config.emb_dim**0.5, rtol=1e-5, atol=1e-5)
    assert np.abs(unscaled - scaled).max() > 0.1
