"""Decoder-only decoding with a prefill: the decode-mode cache contract, prefill == forcing the
prompt token by token == full forward passes, sampling, beam search with prompts, num_decodes."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cairn.models import DecodeOptions, DecoderOnlyModel, get_preset
from cairn.models.decoding import left_align, prepend_prompts
from cairn.models.gpt import Decoder

L = 10  # max_decode_length
_DECODE = {"decode": True, "mutable": ["cache"]}


_FULL = 4  # the row whose prompt (L + 3 tokens) is longer than max_decode_length


@pytest.fixture(scope="module", params=["decoder_only", "llama"])
def setup(tiny, request):
    """A tiny decoder-only model of each family (T5-style with relative positions; Llama with
    RoPE and grouped-query heads), its params, and right-padded prompts of lengths 3, 5, 0, 1
    and L + 3 (row `_FULL`: cut to L, nothing generated). One prompt batch for every test, so
    that each decoding variant compiles once per family."""
    config = tiny.decoder_only if request.param == "decoder_only" else get_preset("llama_tiny").replace(vocab_size=67)
    model = DecoderOnlyModel(config)
    params = tiny.random_params(model)
    prompts = np.zeros((5, L + 3), np.int32)
    prompts[0, :3] = tiny.random_tokens(1, (3,), 67)
    prompts[1, :5] = tiny.random_tokens(2, (5,), 67)
    prompts[3, :1] = 9
    prompts[_FULL] = tiny.random_tokens(6, (L + 3,), 67)
    return model, params, prompts


_COMPILED: dict = {}


def _predict(setup, rng=0, prompts=None, **options):
    model, params, default_prompts = setup
    opts = DecodeOptions(max_decode_length=L, **options)
    key = (id(model), opts)
    if key not in _COMPILED:
        _COMPILED[key] = jax.jit(functools.partial(model.predict_batch, options=opts))
    prompts = default_prompts if prompts is None else prompts
    return jax.tree_util.tree_map(np.asarray, _COMPILED[key](params, prompts, rng=jax.random.PRNGKey(rng)))


def _lengths(prompts):
    return np.minimum(np.cumprod(prompts > 0, axis=1).sum(axis=1), L)


_FORWARD: dict = {}
_ROWS = 15  # the most output rows of a test (5 prompts, 3 samples each)


def _full_forward(setup, tokens, lengths, prefix_lm=False, start=0):
    """Full-forward logits for outputs `tokens` `[rows, L]` (inputs: `start` then the tokens) and
    the positions that were generated (from the prompt's end up to and including EOS). One
    compiled program per family: the rows are padded to `_ROWS`, and the causal pass is the
    prefix-LM pass with an empty prefix."""
    model, params, _ = setup
    rows = tokens.shape[0]
    inputs = np.pad(tokens[:, :-1], ((0, _ROWS - rows), (1, 0)))
    inputs[:, 0] = start
    cols = np.arange(tokens.shape[1])[None, :]
    prefix = np.zeros(inputs.shape, np.int32)
    if prefix_lm:  # BOS and the prompt (input positions 0..len) attend each other
        prefix[:rows] = cols <= lengths[:, None]
    batch = {"decoder_input_tokens": inputs, "decoder_causal_attention": prefix}
    if id(model) not in _FORWARD:
        _FORWARD[id(model)] = jax.jit(model.apply)
    logits = np.asarray(_FORWARD[id(model)](params, batch))[:rows]
    after_eos = (np.cumsum(tokens == 1, axis=1) - (tokens == 1)) > 0
    generated = (cols >= lengths[:, None]) & ~after_eos
    return logits, generated


def _check_against_full_forward(setup, tokens, scores, lengths, prefix_lm=False, greedy=True, start=0):
    logits, generated = _full_forward(setup, tokens, lengths, prefix_lm, start)
    if greedy:
        np.testing.assert_array_equal(logits.argmax(-1)[generated], tokens[generated])
    logp = np.asarray(jax.nn.log_softmax(logits))
    token_logp = np.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(scores, np.where(generated, token_logp, 0).sum(1), rtol=1e-4, atol=1e-4)


# --- the network's decode-mode contract ---------------------------------------------------------


@pytest.mark.parametrize("scan", [False, True])
def test_decode_mode_chunks_give_the_full_forward_logits(tiny, scan):
    """Chunks of 3 then single tokens, and chunks of 3 fed into a non-empty cache, give the full
    forward's logits (two chunk sizes, so two compiled programs), and fill the cache's mask."""
    net = Decoder(tiny.decoder_only.replace(scan_layers=scan))
    tokens = tiny.random_tokens(3, (2, 9), 67)
    params = tiny.random_like(jax.eval_shape(net.init, jax.random.PRNGKey(1), tokens)["params"], seed=1)
    full = np.asarray(jax.jit(net.apply)({"params": params}, tokens))
    apply = jax.jit(functools.partial(net.apply, decode=True, mutable=["cache"]))
    sized = jax.eval_shape(lambda: net.apply({"params": params}, jnp.zeros((2, 9), jnp.int32), **_DECODE)[1])
    empty = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), sized["cache"])
    assert empty["cached_key_mask"].shape == (2, 9) and empty["cache_index"].shape == ()
    for chunks in ([3] + [1] * 6, [3, 3, 3]):
        cache, got, start = empty, [], 0
        for n in chunks:
            logits, mutated = apply({"params": params, "cache": cache}, tokens[:, start : start + n])
            cache, start = mutated["cache"], start + n
            got.append(np.asarray(logits))
        np.testing.assert_allclose(np.concatenate(got, axis=1), full, atol=1e-5)
        assert int(cache["cache_index"]) == 9 and np.all(np.asarray(cache["cached_key_mask"]) == 1)


def test_left_padded_chunk_with_masked_padding_and_prefix(tiny):
    """A prompt left-padded in the cache (segment id 0) gives the unpadded logits; with
    `decoder_causal_attention` the chunk attends as the full prefix-LM forward does."""
    net = Decoder(tiny.decoder_only)
    tokens = tiny.random_tokens(4, (1, 6), 67)
    params = tiny.random_like(jax.eval_shape(net.init, jax.random.PRNGKey(2), tokens)["params"], seed=2)
    prefix = np.array([[1, 1, 1, 1, 0, 0]], np.int32)
    forward = jax.jit(net.apply)
    decode = jax.jit(functools.partial(net.apply, **_DECODE))
    for causal in (None, prefix):
        full = np.asarray(forward({"params": params}, tokens, None, causal))
        sized = jax.eval_shape(lambda: net.apply({"params": params}, jnp.zeros((1, 10), jnp.int32), **_DECODE)[1])
        cache = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), sized["cache"])
        chunk = np.concatenate([np.full((1, 3), 5, np.int32), tokens[:, :4]], axis=1)  # 3 padding keys
        segments = np.array([[0, 0, 0, 1, 1, 1, 1]], np.int32)
        chunk_prefix = None if causal is None else np.pad(prefix[:, :4], ((0, 0), (3, 0)))
        logits, mutated = decode({"params": params, "cache": cache}, chunk, segments, chunk_prefix)
        np.testing.assert_array_equal(mutated["cache"]["cached_key_mask"], [[0, 0, 0, 1, 1, 1, 1, 0, 0, 0]])
        got = [np.asarray(logits)[:, 3:]]
        cache = mutated["cache"]
        for t in (4, 5):
            logits, mutated = decode({"params": params, "cache": cache}, tokens[:, t : t + 1])
            cache = mutated["cache"]
            got.append(np.asarray(logits))
        np.testing.assert_allclose(np.concatenate(got, axis=1), full, atol=1e-5)


def test_left_align_and_prepend_prompts():
    prompts = jnp.array([[5, 6, 0], [0, 0, 0], [7, 8, 9]], jnp.int32)
    tokens, segments, lengths = left_align(prompts)
    np.testing.assert_array_equal(tokens, [[0, 0, 5, 6], [0, 0, 0, 0], [0, 7, 8, 9]])
    np.testing.assert_array_equal(segments, [[0, 1, 1, 1], [0, 0, 0, 1], [1, 1, 1, 1]])
    np.testing.assert_array_equal(lengths, [2, 0, 3])
    tokens, segments, lengths = left_align(prompts, bos_id=None)  # the prompts hold their own start
    np.testing.assert_array_equal(tokens, [[0, 5, 6], [0, 0, 0], [7, 8, 9]])
    np.testing.assert_array_equal(segments, [[0, 1, 1], [0, 0, 0], [1, 1, 1]])
    np.testing.assert_array_equal(lengths, [2, 0, 3])
    cont = jnp.array([[11, 12, 1, 0], [13, 14, 15, 16], [17, 0, 0, 0]], jnp.int32)
    np.testing.assert_array_equal(
        prepend_prompts(prompts, lengths, cont), [[5, 6, 11, 12], [13, 14, 15, 16], [7, 8, 9, 17]]
    )


# --- predict_batch ------------------------------------------------------------------------------


def _short(prompts):
    """The rows whose prompts are shorter than L (they generate tokens)."""
    return _lengths(prompts) < L


def test_greedy_prefill_equals_forcing_and_the_full_forward(setup):
    """Greedy with a prefill == forcing the prompt token by token == the full forward pass;
    each row starts with its prompt; a prompt longer than L is cut to L and scores 0."""
    _, _, prompts = setup
    tokens, scores = _predict(setup)
    forced, forced_scores = _predict(setup, prefill=False)
    np.testing.assert_array_equal(tokens, forced)
    np.testing.assert_allclose(scores, forced_scores, rtol=1e-5, atol=1e-5)
    lengths = _lengths(prompts)
    for r, n in enumerate(lengths):
        np.testing.assert_array_equal(tokens[r, :n], prompts[r, :n])
    _check_against_full_forward(setup, tokens, scores, lengths)
    assert tokens.shape == (5, L) and np.all(scores[_short(prompts)] < 0)
    np.testing.assert_array_equal(tokens[_FULL], prompts[_FULL, :L])
    assert scores[_FULL] == 0.0 and forced_scores[_FULL] == 0.0


def test_the_prompt_start_id_goes_in_front_of_every_prompt(setup):
    """`prompt_start_id` 5 (not T5's 0): the greedy tokens, with a prefill and forced, are the full
    forward's from 5; with `prompt_start_id=None` the prompts `[5] + prompt` give the same rows
    (their first column the 5), and a forced prompt is refused (it needs the start token)."""
    model, params, prompts = setup
    start = 5
    with_start = DecoderOnlyModel(model.config.replace(prompt_start_id=start))
    tokens, scores = _predict((with_start, params, prompts))
    forced, _ = _predict((with_start, params, prompts), prefill=False)
    np.testing.assert_array_equal(tokens, forced)
    _check_against_full_forward(setup, tokens, scores, _lengths(prompts), start=start)
    assert not np.array_equal(tokens, _predict(setup)[0])  # the start token changes the continuations
    given = np.pad(prompts, ((0, 0), (1, 0)), constant_values=start)
    given[2] = 0  # an empty prompt stays empty (it has no start of its own to continue from)
    no_start = DecoderOnlyModel(model.config.replace(prompt_start_id=None))
    own, own_scores = _predict((no_start, params, given))
    rows = [0, 1, 3]
    np.testing.assert_array_equal(own[rows, 0], start)
    np.testing.assert_array_equal(own[rows, 1:], tokens[rows, : L - 1])
    assert np.all(own_scores[:2] < 0)
    with pytest.raises(ValueError, match="prompt_start_id"):
        no_start.predict_batch(params, given, DecodeOptions(prefill=False))


def test_the_decode_loop_updates_the_cache_in_place(setup):
    """The prefill's first logits are used before the loop (`decoding.loop.FirstLogits`), so no
    conditional carries the key-value cache through the loop: XLA copied the whole cache out of
    one at every step. The compiled greedy program has no conditional and copies no buffer of
    the cache's shape."""
    model, params, prompts = setup
    _predict(setup)  # the greedy program the other tests run (compiled once: lowering it again reuses it)
    fn = _COMPILED[(id(model), DecodeOptions(max_decode_length=L))]
    hlo = fn.lower(params, prompts, rng=jax.random.PRNGKey(0)).compile().as_text()
    cache = jax.eval_shape(  # the cache's shapes (abstract: nothing compiled or run op by op)
        lambda: model.module.apply({"params": params}, np.zeros((prompts.shape[0], L), np.int32), **_DECODE)[1]
    )["cache"]
    shapes = {
        f"{jnp.dtype(x.dtype).name.replace('float', 'f')}[{','.join(map(str, x.shape))}]"
        for x in jax.tree_util.tree_leaves(cache)
        if x.ndim >= 3
    }
    assert shapes, "no cache arrays found"
    assert " conditional(" not in hlo
    bodies = re.findall(r" while\(.*?body=%?([\w.\-]+)", hlo)
    assert bodies, "no while loop in the compiled program"
    computations = {m.group(1): m.group(2) for m in re.finditer(r"\n%?([\w.\-]+) \(.*?\{\n(.*?)\n\}", hlo, re.S)}
    copies = [
        line
        for body in bodies
        for line in computations[body].splitlines()
        if " copy(" in line and any(s in line for s in shapes)
    ]
    assert copies == [], copies[:3]


def test_prefill_without_cache_equals_with_cache(setup):
    for options in ({}, {"method": "beam", "num_beams": 4, "num_decodes": 2, "alpha": 0.0}):
        cached, s1 = _predict(setup, **options)
        plain, s2 = _predict(setup, use_cache=False, **options)
        np.testing.assert_array_equal(cached, plain)
        np.testing.assert_allclose(s1, s2, rtol=1e-5, atol=1e-5)


def test_prefix_lm_prefill_attends_bidirectionally_over_the_prompt(setup):
    _, _, prompts = setup
    tokens, scores = _predict(setup, prefix_lm=True)
    _check_against_full_forward(setup, tokens, scores, _lengths(prompts), prefix_lm=True)
    _, causal_scores = _predict(setup)
    assert not np.allclose(scores[:2], causal_scores[:2])  # rows with prompts of 3 and 5 tokens


_SAMPLE = {"method": "sample", "temperature": 1.0, "top_p": 0.95, "num_decodes": 3}


def test_sampling_prefill_equals_forcing_is_reproducible_and_num_decodes_samples_per_prompt(setup):
    """Sampling (top-p, 3 samples per prompt): prefill == forcing; the same key reproduces the
    samples, another changes them; rows are `b * num_decodes`, each starting with its prompt;
    the empty prompt's samples differ; scores are the full forward's token log-probs."""
    _, _, prompts = setup
    a, sa = _predict(setup, rng=3, **_SAMPLE)
    assert a.shape == (15, L) and sa.shape == (15,)
    np.testing.assert_array_equal(a, _predict(setup, rng=3, **_SAMPLE)[0])
    forced, sf = _predict(setup, rng=3, prefill=False, **_SAMPLE)
    np.testing.assert_array_equal(a, forced)
    np.testing.assert_allclose(sa, sf, rtol=1e-5, atol=1e-5)
    assert not np.array_equal(a, _predict(setup, rng=4, **_SAMPLE)[0])
    lengths = np.repeat(_lengths(prompts), 3)
    for r, n in enumerate(lengths):
        np.testing.assert_array_equal(a[r, :n], prompts[r // 3, :n])
    assert len({tuple(row) for row in a[6:9]}) > 1  # the empty prompt's three samples differ
    _check_against_full_forward(setup, a, sa, lengths, greedy=False)


@pytest.mark.parametrize("setup", ["llama"], indirect=True)  # the decoding loop's code, family-independent
def test_top_k_one_and_one_beam_are_greedy(setup):
    greedy, greedy_scores = _predict(setup)
    top1, top1_scores = _predict(setup, rng=5, method="sample", top_k=1)
    np.testing.assert_array_equal(top1, greedy)
    np.testing.assert_allclose(top1_scores, greedy_scores, rtol=1e-5)
    beam, beam_scores = _predict(setup, method="beam", num_beams=1, alpha=0.0)
    np.testing.assert_array_equal(beam, greedy)
    np.testing.assert_allclose(beam_scores, greedy_scores, rtol=1e-5)


def test_beam_search_with_prompts_returns_the_top_beams(setup):
    _, _, prompts = setup
    tokens, scores = _predict(setup, method="beam", num_beams=4, num_decodes=2, alpha=0.0)
    assert tokens.shape == (10, L)
    lengths = np.repeat(_lengths(prompts), 2)
    _check_against_full_forward(setup, tokens, scores, lengths, greedy=False)
    assert np.all(scores[0::2] >= scores[1::2] - 1e-6)  # best first (alpha 0: by log-probability)
    _, greedy_scores = _predict(setup)
    assert np.all(scores[0::2] >= greedy_scores - 1e-5)
    short = _short(prompts)
    assert not np.array_equal(tokens[0::2][short], tokens[1::2][short])


def test_decode_options_are_checked():
    with pytest.raises(ValueError, match="num_decodes"):
        DecodeOptions(num_decodes=2)
    with pytest.raises(ValueError, match="num_beams"):
        DecodeOptions(method="beam", num_beams=2, num_decodes=3)
    with pytest.raises(ValueError, match="prefill"):
        DecodeOptions(prefix_lm=True, prefill=False)
    with pytest.raises(ValueError, match="num_decodes"):
        DecodeOptions(method="sample", num_decodes=0)
    for bad in ({"temperature": -1.0}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}, {"max_new_tokens": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            DecodeOptions(method="sample", **bad)
