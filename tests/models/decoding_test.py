"""Decoding: cache == no cache, one beam == greedy, temperature -> 0 == greedy, top-k/top-p."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cairn.models import DecodeOptions, EncoderDecoderModel
from cairn.models.decoding import beam_search, filter_logits, gather_beams, length_penalty, sample_decode

MAX_LEN = 8


@pytest.fixture(scope="module")
def setup(tiny):
    """A T5.1.1 tiny model with scanned layers (the cache then has a layer axis), its params, a batch."""
    model = EncoderDecoderModel(tiny.t5_1_1.replace(scan_layers=True))
    params = tiny.random_params(model)
    enc = tiny.random_tokens(0, (3, 9), tiny.t5_1_1.vocab_size)
    enc[1, 6:] = 0
    return model, params, {"encoder_input_tokens": enc}


_COMPILED = {}


def _predict(setup, rng=None, **options):
    """`predict_batch` jitted once per options (compilation dominates these tests' time)."""
    model, params, batch = setup
    opts = DecodeOptions(max_decode_length=MAX_LEN, **options)
    key = (id(model), opts)
    if key not in _COMPILED:
        _COMPILED[key] = jax.jit(functools.partial(model.predict_batch, options=opts))
    return jax.tree_util.tree_map(np.asarray, _COMPILED[key](params, batch, rng=rng))


def test_greedy_with_cache_equals_without(setup):
    cached, cached_scores = _predict(setup)
    plain, plain_scores = _predict(setup, use_cache=False)
    np.testing.assert_array_equal(cached, plain)
    np.testing.assert_allclose(cached_scores, plain_scores, rtol=1e-5)
    assert cached.shape == (3, MAX_LEN) and np.all(cached_scores < 0)


def test_greedy_matches_teacher_forced_argmax(setup):
    model, params, batch = setup
    tokens, _ = _predict(setup)
    dec_in = np.pad(tokens[:, :-1], ((0, 0), (1, 0)))
    logits = jax.jit(model.apply)(params, {**batch, "decoder_input_tokens": dec_in})
    argmax = np.asarray(jnp.argmax(logits, -1))
    live = np.cumsum(tokens == 1, axis=1) - (tokens == 1) == 0  # positions up to and including EOS
    np.testing.assert_array_equal(argmax[live], tokens[live])


def test_one_beam_equals_greedy(setup):
    greedy, greedy_scores = _predict(setup)
    beam, beam_scores = _predict(setup, method="beam", num_beams=1, alpha=0.0)
    np.testing.assert_array_equal(beam, greedy)
    np.testing.assert_allclose(beam_scores, greedy_scores, rtol=1e-5)


def test_beam_search_with_cache_equals_without_and_beats_greedy(setup):
    cached, scores = _predict(setup, method="beam", num_beams=3, alpha=0.0)
    plain, plain_scores = _predict(setup, method="beam", num_beams=3, alpha=0.0, use_cache=False)
    np.testing.assert_array_equal(cached, plain)
    np.testing.assert_allclose(scores, plain_scores, rtol=1e-5)
    _, greedy_scores = _predict(setup)
    assert np.all(scores >= greedy_scores - 1e-5)


def test_sampling_at_temperature_near_zero_is_greedy(setup):
    greedy, _ = _predict(setup)
    cold, _ = _predict(setup, rng=jax.random.PRNGKey(7), method="sample", temperature=1e-4)
    np.testing.assert_array_equal(cold, greedy)


def test_sampling_is_a_function_of_the_key(setup):
    a, _ = _predict(setup, rng=jax.random.PRNGKey(1), method="sample", temperature=1.0, top_k=20)
    b, _ = _predict(setup, rng=jax.random.PRNGKey(1), method="sample", temperature=1.0, top_k=20)
    c, _ = _predict(setup, rng=jax.random.PRNGKey(2), method="sample", temperature=1.0, top_k=20)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_sampling_needs_a_key(setup):
    model, params, batch = setup
    with pytest.raises(ValueError, match="rng"):
        model.predict_batch(params, batch, DecodeOptions(method="sample"))


def test_filter_logits_top_k_and_top_p():
    logits = jnp.log(jnp.array([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    kept = lambda x: np.asarray(x[0] > -1e9)
    np.testing.assert_array_equal(kept(filter_logits(logits, top_k=2)), [1, 1, 0, 0, 0])
    np.testing.assert_array_equal(kept(filter_logits(logits, top_p=0.6)), [1, 1, 0, 0, 0])
    np.testing.assert_array_equal(kept(filter_logits(logits, top_p=0.7)), [1, 1, 0, 0, 0])
    np.testing.assert_array_equal(kept(filter_logits(logits, top_p=0.71)), [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(kept(filter_logits(logits, top_p=0.01)), [1, 0, 0, 0, 0])
    shuffled = logits[:, ::-1]
    np.testing.assert_array_equal(kept(filter_logits(shuffled, top_p=0.6)), [0, 0, 0, 1, 1])


def test_gather_beams_uses_the_layer_axis_under_scan():
    cache = {
        "decoder": {
            "layers": {
                "attn": {"cached_key": jnp.arange(2 * 4 * 3).reshape(2, 4, 3), "cache_index": jnp.array([5, 5])}
            },
            "position": jnp.array(5),
        }
    }
    out = gather_beams(cache, jnp.array([1, 1, 3, 0]))
    np.testing.assert_array_equal(
        out["decoder"]["layers"]["attn"]["cached_key"][:, 0], cache["decoder"]["layers"]["attn"]["cached_key"][:, 1]
    )
    np.testing.assert_array_equal(out["decoder"]["layers"]["attn"]["cache_index"], [5, 5])


def test_length_penalty():
    assert float(length_penalty(1.0, 0.6)) == 1.0
    assert float(length_penalty(7.0, 1.0)) == 2.0


def test_unscanned_tied_model_cache_equals_no_cache(tiny):
    """The unrolled layout (one cache per layer: two decoder layers) and T5.1.0's tied logits,
    greedy and beam."""
    model = EncoderDecoderModel(tiny.t5_1_0.replace(num_encoder_layers=1, num_decoder_layers=2))
    setup = (
        model,
        tiny.random_params(model, seed=1),
        {"encoder_input_tokens": tiny.random_tokens(5, (2, 7), tiny.t5_1_0.vocab_size)},
    )
    for options in ({}, {"method": "beam", "num_beams": 2}):
        cached, s1 = _predict(setup, **options)
        plain, s2 = _predict(setup, use_cache=False, **options)
        np.testing.assert_array_equal(cached, plain)
        np.testing.assert_allclose(s1, s2, rtol=1e-5)


# --- each decoding option changes what it should (a model-free `tokens_to_logits`: cheap) -------

_PROBS = np.array([0.0, 0.02, 0.4, 0.25, 0.15, 0.1, 0.05, 0.03])  # token 0 (padding) never drawn


def _fixed(tokens, cache, step):
    """The same next-token distribution at every step, for every row."""
    logits = jnp.log(jnp.maximum(jnp.asarray(_PROBS, jnp.float32), 1e-30))
    return jnp.broadcast_to(logits, (tokens.shape[0], len(_PROBS))), cache


def _draws(**options):
    rows = 256
    tokens, _ = sample_decode(_fixed, jnp.zeros((rows, 1)), rows, 6, jax.random.PRNGKey(3), eos_id=-1, **options)
    return np.asarray(tokens).ravel()


def test_temperature_top_k_and_top_p_change_the_samples_as_they_should():
    plain = _draws()
    assert set(plain) == {1, 2, 3, 4, 5, 6, 7}  # every token but padding, at temperature 1
    cold, hot = _draws(temperature=0.3), _draws(temperature=3.0)
    assert np.mean(cold == 2) > np.mean(plain == 2) > np.mean(hot == 2)
    assert set(_draws(top_k=2)) == {2, 3}
    assert set(_draws(top_p=0.6)) == {2, 3}  # 0.4 + 0.25 reaches 0.6
    assert set(_draws(top_p=0.66)) == {2, 3, 4}
    assert set(_draws(temperature=0.0)) == {2}


def test_alpha_trades_log_probability_for_length():
    """Two hypotheses: `[EOS]` (p 0.6) and `[2, EOS]` (p 0.4 * 0.9). Without a length penalty the
    short one wins; with alpha 5 the long one (its log-probability / ((5 + 2) / 6) ** 5 > the
    short one's)."""

    def logits(tokens, cache, step):
        first = jnp.log(jnp.array([1e-9, 0.6, 0.4, 1e-9]))
        later = jnp.log(jnp.array([1e-9, 0.9, 0.05, 0.05]))
        return jnp.broadcast_to(jnp.where(step == 0, first, later), (tokens.shape[0], 4)), cache

    def best(alpha):
        seqs, _, log_probs = beam_search(logits, jnp.zeros((2, 1)), 1, 2, 4, alpha=alpha, eos_id=1)
        return np.asarray(seqs)[0, 0].tolist(), float(log_probs[0, 0])

    short, long = best(0.0), best(5.0)
    assert short[0] == [1, 0, 0, 0] and long[0] == [2, 1, 0, 0]
    np.testing.assert_allclose([short[1], long[1]], [np.log(0.6), np.log(0.4 * 0.9)], rtol=1e-5)
    with pytest.raises(ValueError, match="alpha"):
        DecodeOptions(method="beam", alpha=-1.0)
