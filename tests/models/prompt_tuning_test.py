"""Prompt tuning (`cairn.models.prompt_tuning`): a prompt initialised from given tokens makes every
family (T5's encoder, the GPT-style decoder, Llama) score and decode exactly as those tokens typed
in front of the input would; a trained prompt decodes as teacher-forced forward passes with its
embeddings in front; initialisations are seeded and deterministic; packed batches and bad configs
are refused, naming the problem. Training the prompt alone: tests/trainer/models_integration_test.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cairn.models import DecodeOptions, DecoderOnlyModel, EncoderDecoderModel, get_preset
from cairn.models.prompt_tuning import (
    FIRST_SAMPLED_ID,
    PromptTuningConfig,
    PromptTuningModel,
    init_prompt,
    prompt_batch,
    sampled_ids,
)

PROMPT_IDS = (5, 9, 11)  # the "typed" prompt: real tokens whose embeddings initialise the learned one


def _prompted(model, base, tokens=PROMPT_IDS):
    """`base` with a prompt of `tokens`' own embeddings (init='tokens')."""
    pt = PromptTuningModel(model, PromptTuningConfig(length=len(tokens), init="tokens", tokens=tokens))
    return pt.merged(pt.initial_params(jax.random.PRNGKey(1), base), base)


def _typed(x, tokens=PROMPT_IDS):
    return np.concatenate([np.tile(np.asarray(tokens, np.int32), (x.shape[0], 1)), x], axis=1)


def test_a_prompt_of_token_embeddings_is_those_tokens_typed_in_front(tiny):
    """T5: the prompt goes before the encoder input, so prompted params score and decode (greedy,
    prefill-free encoder) as the plain params do on the typed encoder input."""
    model = EncoderDecoderModel(tiny.t5_1_1)
    base = tiny.random_params(model)
    prompted = _prompted(model, base)
    enc = tiny.random_tokens(0, (2, 6), 67)
    enc[1, 4:] = 0  # right padding stays behind the prompt's positions
    tgt = tiny.random_tokens(1, (2, 5), 67)
    batch = {"encoder_input_tokens": enc, "decoder_input_tokens": np.pad(tgt[:, :-1], ((0, 0), (1, 0))),
             "decoder_target_tokens": tgt}  # fmt: skip
    typed = {**batch, "encoder_input_tokens": _typed(enc)}
    np.testing.assert_allclose(model.score_batch(prompted, batch), model.score_batch(base, typed), rtol=1e-5)
    options = DecodeOptions(max_decode_length=5, eos_id=-1)
    got, scores = jax.jit(model.predict_batch, static_argnums=2)(prompted, batch, options)
    want, want_scores = jax.jit(model.predict_batch, static_argnums=2)(base, typed, options)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5)


@pytest.mark.parametrize("family", ["decoder_only", "llama"])
def test_decoder_prompts_go_before_the_start_and_are_not_in_the_loss(tiny, family):
    """Decoder models: with `prompt_start_id=None` (the prompt holds its own start), a prompted
    loss equals the typed tokens' loss with target 0 on them, and greedy decoding with a prefill
    (left-aligned rows of different lengths) equals decoding the typed prompts; the prompt
    positions are not part of the returned rows."""
    if family == "llama":
        config = get_preset("llama_tiny", vocab_size=67, prompt_start_id=None)
    else:
        config = tiny.decoder_only.replace(prompt_start_id=None)
    model = DecoderOnlyModel(config)
    base = tiny.random_params(model)
    prompted = _prompted(model, base)
    tgt = tiny.random_tokens(2, (2, 7), 67)
    batch = {"decoder_input_tokens": np.pad(tgt[:, :-1], ((0, 0), (1, 0))), "decoder_target_tokens": tgt}
    n = len(PROMPT_IDS)
    typed = {"decoder_input_tokens": _typed(batch["decoder_input_tokens"]),
             "decoder_target_tokens": np.pad(tgt, ((0, 0), (n, 0)))}  # fmt: skip
    np.testing.assert_allclose(model.loss_fn(prompted, batch)[0], model.loss_fn(base, typed)[0], rtol=1e-5)
    logits = model.apply(prompted, batch)
    assert logits.shape == (2, 7, 67)  # the rows' own positions only
    np.testing.assert_allclose(logits, model.apply(base, typed)[:, n:], rtol=1e-4, atol=1e-5)
    prompts = tiny.random_tokens(3, (2, 4), 67)
    prompts[1, 2:] = 0
    options = DecodeOptions(max_decode_length=8, eos_id=-1)
    got, _ = jax.jit(model.predict_batch, static_argnums=2)(prompted, prompts, options)
    # the typed rows: the prompt tokens, then each prompt
    typed_prompts = np.stack([np.concatenate([PROMPT_IDS, p[p > 0], [0] * (4 - (p > 0).sum())]) for p in prompts])
    want, _ = jax.jit(model.predict_batch, static_argnums=2)(base, typed_prompts.astype(np.int32), options)
    np.testing.assert_array_equal(got[:, : 8 - n], want[:, n:])  # the prompt, then the same continuation
    np.testing.assert_array_equal(got[0, :4], prompts[0])  # rows start with their own prompt


def test_a_trained_prompt_decodes_as_a_forward_pass_with_its_embeddings_in_front(tiny):
    """Any prompt (not a vocabulary row): greedy decoding with the cache and a prefill, with
    start token 0, picks at every step the argmax of the teacher-forced forward pass over
    `[prompt embeddings, 0, prompt, decoded so far]`; a forced (prefill-free) decode is refused."""
    model = DecoderOnlyModel(tiny.decoder_only)
    base = tiny.random_params(model)
    pt = PromptTuningModel(model, PromptTuningConfig(length=4, init="random_uniform"))
    prompted = pt.merged(pt.initial_params(jax.random.PRNGKey(7), base), base)
    prompts = tiny.random_tokens(4, (2, 3), 67)
    prompts[0, 2] = 0
    options = DecodeOptions(max_decode_length=7, eos_id=-1)
    out, _ = jax.jit(model.predict_batch, static_argnums=2)(prompted, prompts, options)
    out = np.asarray(out)
    for r, p in enumerate(prompts):
        k = int((p > 0).sum())
        row = np.concatenate([[0], out[r]])[None].astype(np.int32)  # start, prompt, continuation
        logits = np.asarray(model.apply(prompted, {"decoder_input_tokens": row}))[0]
        np.testing.assert_array_equal(out[r, k:], logits[k:7].argmax(-1))
    with pytest.raises(ValueError, match="needs prefill=True"):
        model.predict_batch(prompted, prompts, DecodeOptions(max_decode_length=7, prefill=False))


def test_initialisations_are_seeded_and_read_the_vocabulary():
    table = jnp.asarray(np.random.default_rng(0).standard_normal((300, 8)), jnp.float32)
    sample = PromptTuningConfig(length=20, sample_top=100)
    a, b = (init_prompt(jax.random.PRNGKey(s), table, sample) for s in (0, 0))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, init_prompt(jax.random.PRNGKey(1), table, sample))
    ids = np.asarray(sampled_ids(jax.random.PRNGKey(0), 300, sample))
    assert len(set(ids)) == 20 and ids.min() >= FIRST_SAMPLED_ID and ids.max() < 100  # frequent ids, distinct
    np.testing.assert_array_equal(a, np.asarray(table)[ids])
    tokens = init_prompt(jax.random.PRNGKey(0), table, PromptTuningConfig(length=5, init="tokens", tokens=(7, 8)))
    np.testing.assert_array_equal(tokens[:2], np.asarray(table)[[7, 8]])  # the rest sampled
    assert np.asarray(sampled_ids(jax.random.PRNGKey(0), 6, PromptTuningConfig(length=5))).max() < 6  # with replacement
    uniform = init_prompt(jax.random.PRNGKey(0), table, PromptTuningConfig(length=3, init="random_uniform"))
    assert uniform.shape == (3, 8) and np.abs(uniform).max() <= 0.5
    with pytest.raises(ValueError, match="past the vocabulary"):
        init_prompt(jax.random.PRNGKey(0), table, PromptTuningConfig(length=2, init="tokens", tokens=(300,)))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(length=0), "length must be an int >= 1"),
        (dict(init="from_labels"), "init must be one of"),
        (dict(init="tokens"), "tokens must hold token ids"),
        (dict(length=1, init="tokens", tokens=(3, 4)), "do not fit a prompt of length 1"),
        (dict(tokens=(3,)), "used by init='tokens' only"),
        (dict(sample_top=2), "sample_top must be >"),
    ],
)
def test_bad_configs_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PromptTuningConfig(**kwargs)


def test_packed_batches_are_refused():
    batch = {"decoder_input_tokens": np.ones((1, 4), np.int32), "decoder_segment_ids": np.ones((1, 4), np.int32)}
    with pytest.raises(ValueError, match="does not support packed batches .decoder_segment_ids."):
        prompt_batch(batch, 67, 2, encoder=False)
