"""The T5 network: logical axes, packed-segment masking, scan and remat switches."""

import jax
import numpy as np
import pytest

from cairn.models import EncoderDecoderModel
from cairn.models.stacking import stack_layers, unstack_layers

KNOWN_AXES = {"layers", "vocab", "embed", "heads", "kv", "mlp", "relpos_buckets"}


def _unscan(params, config):
    out = dict(params)
    out["encoder"] = unstack_layers(params["encoder"], config.num_encoder_layers)
    out["decoder"] = unstack_layers(params["decoder"], config.num_decoder_layers)
    return out


@pytest.fixture(scope="module")
def scanned_params(tiny):
    """T5.1.1 tiny parameters in the scanned layout, shared by the tests below: random values of
    the init's tree drawn with numpy (the properties hold for any; a jitted init's random-number
    program costs seconds of compiling)."""
    return tiny.random_params(EncoderDecoderModel(tiny.t5_1_1.replace(scan_layers=True)), seed=4)


@pytest.fixture(scope="module")
def unrolled_params(tiny, scanned_params):
    return _unscan(scanned_params, tiny.t5_1_1)


@pytest.mark.parametrize("scan", [False, True])
def test_every_parameter_has_logical_axes(tiny, scan):
    model = EncoderDecoderModel(tiny.t5_1_1.replace(scan_layers=scan))
    specs = model.logical_axes()
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0)))
    flat_specs = jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    flat_shapes = jax.tree_util.tree_leaves(shapes)
    assert len(flat_specs) == len(flat_shapes)
    for spec, shape in zip(flat_specs, flat_shapes):
        assert len(spec) == len(shape.shape) and set(spec) <= KNOWN_AXES, (spec, shape)
        assert (spec[0] == "layers") == (scan and len(shape.shape) > 1 and "layers" in spec)
    assert specs["decoder"]["logits"] == jax.sharding.PartitionSpec("embed", "vocab")
    assert specs["token_embedder"]["embedding"] == jax.sharding.PartitionSpec("vocab", "embed")


def _packed_and_unpacked(random_tokens, vocab):
    lens = [(4, 3), (5, 4)]
    enc_rows = [random_tokens(10 + i, (li,), vocab) for i, (li, _) in enumerate(lens)]
    tgt_rows = [random_tokens(20 + i, (lt,), vocab) for i, (_, lt) in enumerate(lens)]
    li_max, lt_max = 11, 9
    packed = {
        k: np.zeros((1, n), np.int32)
        for k, n in [
            ("encoder_input_tokens", li_max),
            ("encoder_segment_ids", li_max),
            ("decoder_input_tokens", lt_max),
            ("decoder_target_tokens", lt_max),
            ("decoder_segment_ids", lt_max),
            ("decoder_loss_weights", lt_max),
        ]
    }
    unpacked = {k: np.zeros((2, v.shape[1]), np.int32) for k, v in packed.items() if "segment" not in k}
    ei = ti = 0
    for s, (enc, tgt) in enumerate(zip(enc_rows, tgt_rows)):
        dec_in = np.concatenate([[0], tgt[:-1]])
        packed["encoder_input_tokens"][0, ei : ei + len(enc)] = enc
        packed["encoder_segment_ids"][0, ei : ei + len(enc)] = s + 1
        packed["decoder_input_tokens"][0, ti : ti + len(tgt)] = dec_in
        packed["decoder_target_tokens"][0, ti : ti + len(tgt)] = tgt
        packed["decoder_segment_ids"][0, ti : ti + len(tgt)] = s + 1
        packed["decoder_loss_weights"][0, ti : ti + len(tgt)] = 1
        unpacked["encoder_input_tokens"][s, : len(enc)] = enc
        unpacked["decoder_input_tokens"][s, : len(tgt)] = dec_in
        unpacked["decoder_target_tokens"][s, : len(tgt)] = tgt
        unpacked["decoder_loss_weights"][s, : len(tgt)] = 1
        ei, ti = ei + len(enc), ti + len(tgt)
    return packed, unpacked, [l for _, l in lens]


def test_packed_segments_do_not_see_each_other(tiny, unrolled_params):
    """One batch (one compiled program): row 0 packs two examples; rows 1 and 2 are the two
    examples alone (one segment each, padding as segment 0)."""
    model, params = EncoderDecoderModel(tiny.t5_1_1), unrolled_params
    packed, unpacked, tlens = _packed_and_unpacked(tiny.random_tokens, tiny.t5_1_1.vocab_size)
    batch = {k: np.concatenate([v, unpacked[k]]) for k, v in packed.items() if "segment" not in k}
    for key, tokens in (
        ("encoder_segment_ids", "encoder_input_tokens"),
        ("decoder_segment_ids", "decoder_loss_weights"),
    ):
        batch[key] = np.concatenate([packed[key], (unpacked[tokens] > 0).astype(np.int32)])
    logits = np.asarray(jax.jit(model.apply)(params, batch))
    lp, lu = logits[0], logits[1:]
    np.testing.assert_allclose(lp[: tlens[0]], lu[0, : tlens[0]], atol=1e-5)
    np.testing.assert_allclose(lp[tlens[0] : sum(tlens)], lu[1, : tlens[1]], atol=1e-5)


def test_causal_decoder_ignores_future_tokens(tiny, unrolled_params):
    model, params = EncoderDecoderModel(tiny.t5_1_1), unrolled_params
    enc = tiny.random_tokens(0, (2, 6), 67)
    dec = tiny.random_tokens(1, (2, 5), 67)
    dec2 = dec.copy()
    dec2[:, 3:] = 5
    apply = jax.jit(model.apply)
    a = apply(params, {"encoder_input_tokens": enc, "decoder_input_tokens": dec})
    b = apply(params, {"encoder_input_tokens": enc, "decoder_input_tokens": dec2})
    np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-6)
    assert not np.allclose(a[:, 3:], b[:, 3:])


def _loss_and_grads(config, params, batch):
    model = EncoderDecoderModel(config)
    return jax.jit(jax.value_and_grad(lambda p: model.loss_fn(p, batch)[0]))(params)


def test_scan_and_remat_switches_give_equal_outputs(tiny, scanned_params, unrolled_params):
    base = tiny.t5_1_1
    enc = tiny.random_tokens(0, (2, 6), 67)
    tgt = tiny.random_tokens(1, (2, 5), 67)
    batch = {
        "encoder_input_tokens": enc,
        "decoder_target_tokens": tgt,
        "decoder_input_tokens": np.pad(tgt[:, :-1], ((0, 0), (1, 0))),
    }
    # Each variant costs a compilation: scanned with full remat against unrolled with the dots
    # policy (two layouts, both policies; remat only changes what the backward pass recomputes).
    ref_loss, ref_grads = _loss_and_grads(base.replace(remat_policy="dots"), unrolled_params, batch)
    loss, grads = _loss_and_grads(base.replace(scan_layers=True, remat_policy="full"), scanned_params, batch)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), _unscan(grads, base), ref_grads
    )
    assert float(ref_loss) > 0 and max(float(np.abs(g).max()) for g in jax.tree_util.tree_leaves(ref_grads)) > 0


def test_stack_and_unstack_are_inverse(scanned_params):
    params = scanned_params
    back = stack_layers(unstack_layers(params["encoder"], 2), 2)
    jax.tree_util.tree_map(np.testing.assert_array_equal, back, params["encoder"])


def test_dropout_is_active_only_with_a_key(tiny, unrolled_params):
    model = EncoderDecoderModel(tiny.t5_1_1.replace(dropout_rate=0.3, num_encoder_layers=1, num_decoder_layers=1))
    # Dropout has no parameters: the shared tiny parameters with their first layer only.
    params = {k: v for k, v in unrolled_params.items() if k not in ("encoder", "decoder")}
    for stack in ("encoder", "decoder"):
        params[stack] = {k: v for k, v in unrolled_params[stack].items() if k != "layers_1"}
    batch = {
        "encoder_input_tokens": tiny.random_tokens(0, (2, 6), 67),
        "decoder_input_tokens": tiny.random_tokens(1, (2, 5), 67),
    }
    apply = jax.jit(model.apply)
    a, b = apply(params, batch), apply(params, batch)
    np.testing.assert_array_equal(a, b)
    c = apply(params, batch, jax.random.PRNGKey(1))
    d = apply(params, batch, jax.random.PRNGKey(1))
    np.testing.assert_array_equal(c, d)
    assert not np.allclose(a, c)


def test_attention_bias_parts_equal_the_dense_bias_where_keys_are_seen():
    # XLA's path adds `parts_bias` (position bias and a mask, never broadcast to [b, h, q, k] before
    # the logits): at every unmasked key it is the dense bias exactly; masked keys stay masked.
    from cairn.models.attention import NEG_INF, AttentionBias, causal_mask, mask_to_bias, parts_bias, segment_mask

    rng = np.random.default_rng(0)
    pos = rng.normal(size=(1, 2, 6, 6)).astype(np.float32)
    seg = np.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]], np.int32)
    enc_seg = np.array([[1, 1, 2, 2, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]], np.int32)
    self_mask = causal_mask(6) & segment_mask(seg, seg)
    cases = {
        "encoder": (pos + mask_to_bias(segment_mask(seg, seg)), pos, seg, seg, False),
        "causal self": (pos + mask_to_bias(self_mask), pos, seg, seg, True),
        "cross": (mask_to_bias(segment_mask(seg, enc_seg)), None, seg, enc_seg, False),
    }
    for name, (dense, kernel_bias, q_seg, kv_seg, causal) in cases.items():
        bias = AttentionBias(dense, kernel_bias, q_seg, kv_seg, causal=causal)
        total = sum(np.broadcast_to(p, (2, 2) + dense.shape[2:]) for p in parts_bias(bias))
        dense = np.broadcast_to(dense, total.shape)
        seen = dense > NEG_INF / 2
        assert seen.any() and (~seen).any(), name
        np.testing.assert_array_equal(total[seen], dense[seen], err_msg=name)
        assert (total[~seen] <= NEG_INF / 2).all(), name
        assert all(p.shape[0] == 1 or p.shape[1] == 1 for p in parts_bias(bias)), name  # none [b, h, ...]
