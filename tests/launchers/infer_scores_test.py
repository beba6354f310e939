"""infer's `score` mode: `predict_fns.score_features` + `score_batch` is each target's
log-likelihood given its prompt, equal to the sum of log-softmax entries of the model's logits
computed one unpadded example at a time (both model families, random weights). The model's
`apply` and `score_batch` run jitted, as infer runs them (one compile per shape: op-by-op
dispatch of the tiny models cost more than twice as much CPU)."""

import dataclasses

import jax
import numpy as np
import pytest

from cairn.launchers import predict_fns
from cairn.models import PRESETS
from cairn.models.families import get_family

PROMPTS = [[5, 9, 17, 3], [40], [7, 7, 7, 7, 7, 8], []]
TARGETS = [[11, 12, 1], [99, 98, 97, 96, 1], [2], [30, 31]]


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
