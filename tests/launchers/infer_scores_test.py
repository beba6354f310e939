"""infer's `score` mode: `predict_fns.score_features` + `score_batch` is each target's
log-likelihood given its prompt, equal to the sum of log-softmax entries of the model's logits
computed one unpadded example at a time (both model families, random weights). The model's
`apply` and `score_batch` run jitted, as infer runs them (one compile per shape: op-by-op
dispatch of the tiny models cost more than twice as much CPU).

Decoding as infer decodes (`predict_fns.decode_options`: a per-row budget of `NEW` tokens): a
prompt decoded alone equals the same prompt in a batch of longer and shorter ones (prediction
and score), and a prediction's score is `score_batch` of (prompt, prediction), for T5, the
GPT-style decoder and Llama, greedy, sampled and beam."""

import dataclasses
import functools

import jax
import numpy as np
import pytest

from cairn.launchers import predict_fns
from cairn.launchers.post_training import pad_rows
from cairn.models import PRESETS, DecodeOptions
from cairn.models.families import get_family

PROMPTS = [[5, 9, 17, 3], [40], [7, 7, 7, 7, 7, 8], []]
TARGETS = [[11, 12, 1], [99, 98, 97, 96, 1], [2], [30, 31]]


@functools.cache
def _model(kind, preset):
    family = get_family(kind)
    net = dataclasses.replace(PRESETS[preset], vocab_size=128)
    model = family.make_model(net)
    params = model.init(jax.random.PRNGKey(3))
    model.apply, model.score_batch = jax.jit(model.apply), jax.jit(model.score_batch)
    return family, model, params


def _log_probs(logits, ids):
    """log-softmax of one row's logits `[1, length, vocab]` at `ids`, in float64."""
    x = np.asarray(logits, np.float64)[0]
    top = x.max(-1, keepdims=True)
    logp = x - top - np.log(np.exp(x - top).sum(-1, keepdims=True))
    return [float(logp[j, t]) for j, t in enumerate(ids)]


def _direct_decoder_only(model, params, prompt, target):
    seq = prompt + target
    logits = model.apply(params, {"decoder_input_tokens": np.array([[0] + seq[:-1]], np.int32)})
    return sum(_log_probs(logits, seq)[len(prompt) :])


def _direct_encoder_decoder(model, params, prompt, target):
    batch = {
        "encoder_input_tokens": np.array([prompt or [0]], np.int32),
        "decoder_input_tokens": np.array([[0] + target[:-1]], np.int32),
        "decoder_target_tokens": np.array([target], np.int32),
    }
    return sum(_log_probs(model.apply(params, batch), target))


@pytest.mark.parametrize(
    "kind, preset, direct",
    [
        ("decoder_only", "decoder_only_tiny", _direct_decoder_only),
        ("encoder_decoder", "t5_1_1_tiny", _direct_encoder_decoder),
    ],
)
def test_scores_are_the_targets_log_likelihood_from_the_logits(kind, preset, direct):
    family, model, params = _model(kind, preset)
    feats = predict_fns.score_features(family, PROMPTS, TARGETS, prompt_width=8, target_width=6)
    scores = np.asarray(model.score_batch(params, feats))
    want = [direct(model, params, p, t) for p, t in zip(PROMPTS, TARGETS)]
    np.testing.assert_allclose(scores, want, rtol=2e-4, atol=2e-4)
    assert all(s < 0 for s in scores)
    # Padding to other widths (chunks share one shape) does not change a score.
    wider = predict_fns.score_features(family, PROMPTS, TARGETS, prompt_width=12, target_width=9)
    np.testing.assert_allclose(np.asarray(model.score_batch(params, wider)), scores, rtol=1e-5, atol=1e-5)


def test_decoder_only_features_weight_only_the_target():
    family = get_family("decoder_only")
    feats = predict_fns.score_features(family, [[5, 6]], [[7, 1]], prompt_width=3, target_width=3)
    assert feats["decoder_target_tokens"].tolist() == [[5, 6, 7, 1, 0, 0]]
    assert feats["decoder_input_tokens"].tolist() == [[0, 5, 6, 7, 1, 0]]
    assert feats["decoder_loss_weights"].tolist() == [[0, 0, 1, 1, 0, 0]]


NEW = 5  # tokens each prediction may have
DECODINGS = {
    "greedy": {},
    "sample": {"method": "sample", "temperature": 0.8, "top_k": 40, "top_p": 0.9, "num_decodes": 2},
    "beam": {"method": "beam", "num_beams": 3, "alpha": 0.6, "num_decodes": 2},
}
_PREDICT: dict = {}


def _decode(family, model, params, prompts, width, decoding):
    """`(predictions, scores)` of `prompts` padded to `width`, as `predict_fns.Decoder` decodes:
    `decode_options`' per-row budget, the prompt removed, each prediction cut at padding."""
    continues = family.continues_prompt
    options = DecodeOptions(
        **decoding, max_decode_length=NEW + (width if continues else 0), max_new_tokens=NEW, eos_id=1
    )
    if (id(model), options) not in _PREDICT:
        _PREDICT[id(model), options] = jax.jit(functools.partial(model.predict_batch, options=options))
    batch = family.decode_batch(pad_rows(prompts, width))
    tokens, scores = _PREDICT[id(model), options](params, batch, rng=jax.random.PRNGKey(7))
    n = options.num_decodes
    starts = np.repeat([len(p) if continues else 0 for p in prompts], n)
    preds = [[int(t) for t in row[s : s + NEW]] for row, s in zip(np.asarray(tokens), starts)]
    return [p[: p.index(0)] if 0 in p else p for p in preds], np.asarray(scores)


@pytest.mark.parametrize("method", list(DECODINGS))
@pytest.mark.parametrize(
    "kind, preset", [("decoder_only", "decoder_only_tiny"), ("llama", "llama_tiny"), ("encoder_decoder", "t5_1_1_tiny")]
)
def test_a_prompt_decodes_alone_as_in_a_batch_and_scores_its_prediction(kind, preset, method):
    family, model, params = _model(kind, preset)
    decoding = DECODINGS[method]
    n = decoding.get("num_decodes", 1)
    # T5's inputs end with EOS (as the tasks' do); row 2 is the longest, and not first.
    prompts = PROMPTS if family.continues_prompt else [p + [1] for p in PROMPTS]
    preds, scores = _decode(family, model, params, prompts, 9, decoding)
    assert len(preds) == len(prompts) * n and all(len(p) <= NEW for p in preds)
    assert any(len(p) == NEW for p in preds[3 * n :])  # the empty prompt had room beyond NEW
    alone, alone_scores = _decode(family, model, params, prompts[2:3], len(prompts[2]), decoding)
    assert alone == preds[2 * n : 3 * n]
    np.testing.assert_allclose(alone_scores, scores[2 * n : 3 * n], rtol=1e-4, atol=1e-4)
    # Each score is the log-likelihood of exactly the tokens returned.
    rows = [p for p in prompts for _ in range(n)]
    feats = predict_fns.score_features(family, rows, preds, prompt_width=9, target_width=NEW)
    np.testing.assert_allclose(np.asarray(model.score_batch(params, feats)), scores, rtol=1e-4, atol=1e-4)


def test_num_decodes_returns_the_best_decode_of_each_prompt():
    """`best_decodes`: sampling returns each prompt's sample of highest log-probability (so more
    samples never lower a prediction's score), beam search its first (best) beam."""
    tokens = np.arange(4 * 3).reshape(4, 3)  # 2 prompts x 2 decodes
    scores = np.array([-3.0, -1.0, -2.0, -5.0], np.float32)
    sample = DecodeOptions(method="sample", num_decodes=2)
    best, best_scores = predict_fns.best_decodes(tokens, scores, sample)
    assert np.asarray(best).tolist() == [[3, 4, 5], [6, 7, 8]] and np.asarray(best_scores).tolist() == [-1.0, -2.0]
    beam = DecodeOptions(method="beam", num_beams=2, num_decodes=2)
    best, best_scores = predict_fns.best_decodes(tokens, scores, beam)
    assert np.asarray(best).tolist() == [[0, 1, 2], [6, 7, 8]] and np.asarray(best_scores).tolist() == [-3.0, -2.0]
    one = DecodeOptions(method="sample")
    assert predict_fns.best_decodes(tokens, scores, one)[0] is tokens
