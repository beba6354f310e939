"""Golden tests: exact model features for every converter, packed and unpacked."""

import numpy as np
import pytest
import tensorflow as tf
from data_util import as_lists, ids_dataset

import cairn.datatasks as dt


def convert(converter, examples, lengths):
    return as_lists(converter(ids_dataset(examples), lengths))


def test_encdec_unpacked():
    out = convert(
        dt.EncDecFeatureConverter(pack=False),
        [{"inputs": [9, 4, 3, 8, 1], "targets": [3, 9, 4, 1]}],
        {"inputs": 7, "targets": 5},
    )
    assert out == [
        {
            "encoder_input_tokens": [9, 4, 3, 8, 1, 0, 0],
            "decoder_target_tokens": [3, 9, 4, 1, 0],
            "decoder_input_tokens": [0, 3, 9, 4, 1],
            "decoder_loss_weights": [1, 1, 1, 1, 0],
        }
    ]


def test_encdec_unpacked_targets_at_max_length():
    out = convert(
        dt.EncDecFeatureConverter(pack=False),
        [{"inputs": [9, 4, 3, 8, 1], "targets": [3, 9, 4, 5, 1]}],
        {"inputs": 5, "targets": 5},
    )
    assert out[0]["decoder_input_tokens"] == [0, 3, 9, 4, 5]
    assert out[0]["decoder_loss_weights"] == [1, 1, 1, 1, 1]


def test_encdec_unpacked_trims_overlong_features():
    # Deliberate difference from seqio (which raises): features are trimmed.
    out = convert(
        dt.EncDecFeatureConverter(pack=False),
        [{"inputs": [9, 4, 3, 8, 4, 5, 1], "targets": [3, 9, 4, 7, 8, 1]}],
        {"inputs": 5, "targets": 4},
    )
    assert out[0]["encoder_input_tokens"] == [9, 4, 3, 8, 4]
    assert out[0]["decoder_target_tokens"] == [3, 9, 4, 7]
    assert out[0]["decoder_input_tokens"] == [0, 3, 9, 4]


def test_encdec_packed():
    out = convert(
        dt.EncDecFeatureConverter(pack=True),
        [{"inputs": [7, 8, 5, 1], "targets": [3, 9, 1]}, {"inputs": [8, 4, 9, 3, 1], "targets": [4, 1]}],
        {"inputs": 10, "targets": 7},
    )
    assert out == [
        {
            "encoder_input_tokens": [7, 8, 5, 1, 8, 4, 9, 3, 1, 0],
            "encoder_segment_ids": [1, 1, 1, 1, 2, 2, 2, 2, 2, 0],
            "encoder_positions": [0, 1, 2, 3, 0, 1, 2, 3, 4, 0],
            "decoder_target_tokens": [3, 9, 1, 4, 1, 0, 0],
            "decoder_input_tokens": [0, 3, 9, 0, 4, 0, 0],
            "decoder_loss_weights": [1, 1, 1, 1, 1, 0, 0],
            "decoder_segment_ids": [1, 1, 1, 2, 2, 0, 0],
            "decoder_positions": [0, 1, 2, 0, 1, 0, 0],
        }
    ]


def test_encdec_packed_overflow_starts_a_new_row():
    out = convert(
        dt.EncDecFeatureConverter(pack=True),
        [
            {"inputs": [7, 8, 5, 1], "targets": [3, 9, 1]},
            {"inputs": [8, 4, 9, 3, 1], "targets": [4, 1]},
            {"inputs": [2, 1], "targets": [6, 6, 1]},
        ],
        {"inputs": 8, "targets": 6},
    )
    assert out == [
        {
            "encoder_input_tokens": [7, 8, 5, 1, 0, 0, 0, 0],
            "encoder_segment_ids": [1, 1, 1, 1, 0, 0, 0, 0],
            "encoder_positions": [0, 1, 2, 3, 0, 0, 0, 0],
            "decoder_target_tokens": [3, 9, 1, 0, 0, 0],
            "decoder_input_tokens": [0, 3, 9, 0, 0, 0],
            "decoder_loss_weights": [1, 1, 1, 0, 0, 0],
            "decoder_segment_ids": [1, 1, 1, 0, 0, 0],
            "decoder_positions": [0, 1, 2, 0, 0, 0],
        },
        {
            "encoder_input_tokens": [8, 4, 9, 3, 1, 2, 1, 0],
            "encoder_segment_ids": [1, 1, 1, 1, 1, 2, 2, 0],
            "encoder_positions": [0, 1, 2, 3, 4, 0, 1, 0],
            "decoder_target_tokens": [4, 1, 6, 6, 1, 0],
            "decoder_input_tokens": [0, 4, 0, 6, 6, 0],
            "decoder_loss_weights": [1, 1, 1, 1, 1, 0],
            "decoder_segment_ids": [1, 1, 2, 2, 2, 0],
            "decoder_positions": [0, 1, 0, 1, 2, 0],
        },
    ]


def test_lm_unpacked():
    out = convert(dt.LMFeatureConverter(pack=False), [{"targets": [3, 9, 4, 1]}], {"targets": 6})
    assert out == [
        {
            "decoder_target_tokens": [3, 9, 4, 1, 0, 0],
            "decoder_input_tokens": [0, 3, 9, 4, 1, 0],
            "decoder_loss_weights": [1, 1, 1, 1, 0, 0],
        }
    ]


def test_lm_packed():
    out = convert(dt.LMFeatureConverter(pack=True), [{"targets": [3, 9, 1]}, {"targets": [4, 1]}], {"targets": 6})
    assert out == [
        {
            "decoder_target_tokens": [3, 9, 1, 4, 1, 0],
            "decoder_input_tokens": [0, 3, 9, 0, 4, 0],
            "decoder_loss_weights": [1, 1, 1, 1, 1, 0],
            "decoder_segment_ids": [1, 1, 1, 2, 2, 0],
            "decoder_positions": [0, 1, 2, 0, 1, 0],
        }
    ]


def test_lm_packing_works_in_groups_of_max_length_examples():
    # As in seqio, packing restarts every max(lengths) = 4 examples: [9] is not joined
    # with [10] and [11], which start the next group.
    out = convert(
        dt.LMFeatureConverter(pack=True), [{"targets": t} for t in ([5, 6], [7], [8], [9], [10], [11])], {"targets": 4}
    )
    assert [o["decoder_target_tokens"] for o in out] == [[5, 6, 7, 8], [9, 0, 0, 0], [10, 11, 0, 0]]
    assert [o["decoder_segment_ids"] for o in out] == [[1, 1, 2, 3], [1, 0, 0, 0], [1, 2, 0, 0]]


def test_prefix_lm_unpacked():
    out = convert(
        dt.PrefixLMFeatureConverter(pack=False),
        [{"inputs": [9, 4, 6, 1], "targets": [3, 9, 1]}],
        {"inputs": 10, "targets": 4},
    )
    assert out == [
        {
            "decoder_target_tokens": [9, 4, 6, 1, 3, 9, 1, 0, 0, 0, 0, 0, 0, 0],
            "decoder_input_tokens": [0, 9, 4, 6, 1, 3, 9, 1, 0, 0, 0, 0, 0, 0],
            "decoder_loss_weights": [0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
            "decoder_causal_attention": [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        }
    ]


def test_prefix_lm_unpacked_loss_on_everything():
    out = convert(
        dt.PrefixLMFeatureConverter(pack=False, loss_on_targets_only=False),
        [{"inputs": [9, 4, 6, 1], "targets": [3, 9, 1]}],
        {"inputs": 5, "targets": 4},
    )
    assert out[0]["decoder_loss_weights"] == [1, 1, 1, 1, 1, 1, 1, 0, 0]


def test_prefix_lm_packed():
    out = convert(
        dt.PrefixLMFeatureConverter(pack=True),
        [{"inputs": [7, 8, 5, 1], "targets": [3, 9, 1]}, {"inputs": [8, 4, 9, 3, 1], "targets": [4, 1]}],
        {"inputs": 7, "targets": 8},
    )
    assert out == [
        {
            "decoder_target_tokens": [7, 8, 5, 1, 3, 9, 1, 8, 4, 9, 3, 1, 4, 1, 0],
            "decoder_input_tokens": [0, 7, 8, 5, 1, 3, 9, 0, 8, 4, 9, 3, 1, 4, 0],
            "decoder_loss_weights": [0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0],
            "decoder_positions": [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0],
            "decoder_segment_ids": [1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 0],
            "decoder_causal_attention": [1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0],
        }
    ]


def test_model_feature_lengths():
    assert (
        dt.EncDecFeatureConverter(pack=True).get_model_feature_lengths({"inputs": 7, "targets": 5})["decoder_positions"]
        == 5
    )
    assert dt.PrefixLMFeatureConverter(pack=False).get_model_feature_lengths({"inputs": 7, "targets": 5}) == {
        k: 12 for k in dt.PrefixLMFeatureConverter.MODEL_FEATURES
    }


def test_shapes_are_static():
    ds = dt.EncDecFeatureConverter(pack=True)(
        ids_dataset([{"inputs": [1, 2], "targets": [3]}]), {"inputs": 6, "targets": 4}
    )
    assert ds.element_spec["encoder_input_tokens"].shape == [6]
    assert ds.element_spec["decoder_positions"].shape == [4]


@pytest.mark.parametrize(
    "examples,lengths,match",
    [
        ([{"targets": [1, 2]}], {"inputs": 4, "targets": 4}, "no feature 'inputs'"),
        ([{"inputs": [1], "targets": [1]}], {"targets": 4}, "missing \\['inputs'\\]"),
        ([{"inputs": [1], "targets": [1]}], {"inputs": 0, "targets": 4}, "'inputs' must be an int >= 1"),
    ],
)
def test_bad_input_is_named(examples, lengths, match):
    with pytest.raises(dt.DataTasksError, match=match):
        dt.EncDecFeatureConverter()(ids_dataset(examples), lengths)


def test_float_and_rank_2_features_are_refused():
    floats = tf.data.Dataset.from_tensors({"inputs": tf.constant([1.0]), "targets": tf.constant([1])})
    with pytest.raises(dt.DataTasksError, match="'inputs' must be integer ids"):
        dt.EncDecFeatureConverter()(floats, {"inputs": 4, "targets": 4})
    rank2 = tf.data.Dataset.from_tensors({"inputs": tf.constant([[1]]), "targets": tf.constant([1])})
    with pytest.raises(dt.DataTasksError, match="'inputs' must have rank 1"):
        dt.EncDecFeatureConverter()(rank2, {"inputs": 4, "targets": 4})


def test_pack_group_matches_a_plain_greedy_reference():
    from cairn.datatasks.packing import pack_group

    rng = np.random.default_rng(0)
    seqs = [rng.integers(1, 50, size=rng.integers(1, 9)) for _ in range(40)]
    batch = np.zeros((40, 8), np.int32)
    for i, s in enumerate(seqs):
        batch[i, : len(s)] = s
    out = pack_group({"targets": batch}, {"targets": 10})
    rows, cur = [], []
    for s in seqs:
        if sum(map(len, cur)) + len(s) > 10:
            rows.append(cur)
            cur = []
        cur.append(s)
    rows.append(cur)
    assert len(out["targets"]) == len(rows)
    for r, row in enumerate(rows):
        flat = np.concatenate(row)
        np.testing.assert_array_equal(out["targets"][r][: len(flat)], flat)
        assert (out["targets"][r][len(flat) :] == 0).all()
        assert out["targets_segment_ids"][r].max() == len(row)
