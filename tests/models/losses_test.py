"""Losses: cross-entropy with label smoothing and z-loss, normalising factors, packed == unpacked."""

import jax
import numpy as np
import optax
import pytest

from cairn.models import EncoderDecoderModel, losses


def _logits_and_targets():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 11)).astype(np.float32) * 3
    targets = rng.integers(1, 11, size=(3, 5)).astype(np.int32)
    targets[1, 3:] = 0
    return logits, targets


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy_matches_optax(label_smoothing):
    logits, targets = _logits_and_targets()
    weights = (targets > 0).astype(np.float32)
    total, z, weight_sum = losses.weighted_cross_entropy(logits, targets, weights, label_smoothing=label_smoothing)
    v = logits.shape[-1]
    soft = optax.smooth_labels(jax.nn.one_hot(targets, v), 0.0) * (1 - label_smoothing) + (
        1 - jax.nn.one_hot(targets, v)
    ) * label_smoothing / (v - 1)
    ref = optax.softmax_cross_entropy(logits, soft)
    if label_smoothing:
        c, low = 1 - label_smoothing, label_smoothing / (v - 1)
        ref = ref + (c * np.log(c) + (v - 1) * low * np.log(low))
    np.testing.assert_allclose(total, np.sum(ref * weights), rtol=1e-5)
    assert float(z) == 0.0 and float(weight_sum) == weights.sum()


def test_z_loss_adds_log_z_squared():
    logits, targets = _logits_and_targets()
    base, _, _ = losses.weighted_cross_entropy(logits, targets)
    total, z, _ = losses.weighted_cross_entropy(logits, targets, z_loss=1e-2)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    expected_z = 1e-2 * np.sum(np.square(log_z) * (targets > 0))
    np.testing.assert_allclose(z, expected_z, rtol=1e-5)
    np.testing.assert_allclose(total, base + expected_z, rtol=1e-5)


def test_normalizing_factor_modes():
    logits, targets = _logits_and_targets()
    weights = (targets > 0).astype(np.float32)
    summed, _, _ = losses.weighted_cross_entropy(logits, targets, weights)
    per_token = lambda f: losses.weighted_cross_entropy(logits, targets, weights, loss_normalizing_factor=f)[0]
    np.testing.assert_allclose(per_token(4.0), summed / 4, rtol=1e-6)
    np.testing.assert_allclose(per_token(losses.NUM_REAL_TARGET_TOKENS), summed / weights.sum(), rtol=1e-6)
    np.testing.assert_allclose(per_token(losses.NUM_TOTAL_TARGET_TOKENS), summed / targets.size, rtol=1e-6)
    token_losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    per_seq = np.sum(token_losses * weights, 1) / weights.sum(1)
    np.testing.assert_allclose(per_token(losses.AVERAGE_PER_SEQUENCE), per_seq.mean(), rtol=1e-5)
    with pytest.raises(ValueError, match="NUM_REAL_TARGET_TOKENS"):
        per_token("PER_BANANA")


def _packed_batch(random_tokens, vocab):
    """Two examples packed into one row, and the same two examples as two rows."""
    encs = [random_tokens(1, (4,), vocab), random_tokens(2, (6,), vocab)]
    tgts = [random_tokens(3, (3,), vocab), random_tokens(4, (5,), vocab)]
    packed = {
        k: np.zeros((1, 12 if k.startswith("encoder") else 10), np.int32)
        for k in (
            "encoder_input_tokens",
            "encoder_segment_ids",
            "decoder_input_tokens",
            "decoder_target_tokens",
            "decoder_segment_ids",
            "decoder_loss_weights",
        )
    }
    rows = []
    ei = ti = 0
    for s, (enc, tgt) in enumerate(zip(encs, tgts)):
        dec_in = np.concatenate([[0], tgt[:-1]]).astype(np.int32)
        for key, start, value in (
            ("encoder_input_tokens", ei, enc),
            ("encoder_segment_ids", ei, s + 1 + 0 * enc),
            ("decoder_input_tokens", ti, dec_in),
            ("decoder_target_tokens", ti, tgt),
            ("decoder_segment_ids", ti, s + 1 + 0 * tgt),
            ("decoder_loss_weights", ti, 1 + 0 * tgt),
        ):
            packed[key][0, start : start + len(value)] = value
        rows.append(
            {
                "encoder_input_tokens": enc,
                "decoder_input_tokens": dec_in,
                "decoder_target_tokens": tgt,
                "decoder_loss_weights": np.ones(len(tgt), np.float32),
            }
        )
        ei, ti = ei + len(enc), ti + len(tgt)
    # Unpacked: one sequence per row, zero-padded (padding has weight 0 and segment 0).
    unpacked = {k: np.stack([np.pad(r[k], (0, 6 - len(r[k]))) for r in rows]) for k in rows[0]}
    return packed, unpacked


def test_packed_batch_loss_equals_unpacked_losses(tiny):
    """Summed (factor None) and per-sequence losses, both from one compiled program (the models
    differ only in their loss); one encoder and one decoder layer hold every segment mask (self-
    and cross-attention)."""
    config = tiny.t5_1_1.replace(num_encoder_layers=1, num_decoder_layers=1)
    factors = (None, losses.AVERAGE_PER_SEQUENCE)
    models = [EncoderDecoderModel(config, label_smoothing=0.1, z_loss=1e-3, loss_normalizing_factor=f) for f in factors]
    params = tiny.random_params(models[0])
    packed, unpacked = _packed_batch(tiny.random_tokens, config.vocab_size)

    def row_losses(logits, factor):
        """Each sequence's loss on its own, from the unpacked rows' logits."""
        return [
            losses.weighted_cross_entropy(
                logits[i : i + 1],
                unpacked["decoder_target_tokens"][i : i + 1],
                unpacked["decoder_loss_weights"][i : i + 1],
                label_smoothing=0.1,
                z_loss=1e-3,
                loss_normalizing_factor=factor,
            )[0]
            for i in range(2)
        ]

    def run(p):
        logits = models[0].apply(p, unpacked)
        return [
            (m.loss_fn(p, packed), m.loss_fn(p, unpacked)[0], row_losses(logits, f)) for m, f in zip(models, factors)
        ]

    # Everything in the one program (op by op, each operation would compile its own).
    results = jax.jit(run)(params)
    for factor, ((packed_loss, metrics), unpacked_loss, rows) in zip(factors, results, strict=True):
        expected = sum(map(float, rows)) if factor is None else np.mean([float(r) for r in rows])
        np.testing.assert_allclose(packed_loss, expected, rtol=1e-5, err_msg=str(factor))
        np.testing.assert_allclose(unpacked_loss, expected, rtol=1e-5, err_msg=str(factor))
        assert float(metrics["weight_sum"]) == pytest.approx(8 if factor is None else 2, rel=1e-6)
        assert 0.0 <= float(metrics["accuracy"]) <= 1.0


def test_score_batch_is_the_sum_of_token_log_probs(tiny):
    """T5.1.0 (tied logits), one layer a side: the score does not depend on depth."""
    config = tiny.t5_1_0.replace(num_encoder_layers=1, num_decoder_layers=1)
    model = EncoderDecoderModel(config)
    params = tiny.random_params(model)
    tgt = tiny.random_tokens(1, (2, 4), 67)
    tgt[1, 2:] = 0
    batch = {
        "encoder_input_tokens": tiny.random_tokens(0, (2, 5), 67),
        "decoder_target_tokens": tgt,
        "decoder_input_tokens": np.pad(tgt[:, :-1], ((0, 0), (1, 0))),
    }
    scores, logp = jax.jit(lambda p: (model.score_batch(p, batch), jax.nn.log_softmax(model.apply(p, batch))))(params)
    logp = np.asarray(logp)
    expected = [sum(float(logp[b, i, tgt[b, i]]) for i in range(4) if tgt[b, i] > 0) for b in range(2)]
    np.testing.assert_allclose(scores, expected, rtol=1e-5)
