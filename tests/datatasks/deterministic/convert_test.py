"""The converters' NumPy conversion (`convert_numpy`, the deterministic reader's) equals
their TensorFlow conversion (`ConvertStage`: the converter itself on each row's examples)."""

import numpy as np
import pytest

import cairn.datatasks as dt
from cairn.datatasks.deterministic.record_stage import ConvertStage
from cairn.datatasks.ragged import Ragged


def _rows(keys, n_rows, per_row, seed=0, least=0):
    rng = np.random.default_rng(seed)
    return {
        k: [
            [rng.integers(2, 50, size=rng.integers(least, 4)).astype(np.int32) for _ in range(per_row)]
            for _ in range(n_rows)
        ]
        for k in keys
    }


def _flat(conv, rows):
    """`({feature: Ragged}, row sizes)` of per-row lists of examples: what both conversions take."""
    keys = list(conv.TASK_FEATURES)
    flat = {k: Ragged.from_list([e for row in rows[k] for e in row]) for k in keys}
    return flat, np.array([len(r) for r in rows[keys[0]]])


def _numpy(conv, rows, lengths):
    return conv.convert_numpy(*_flat(conv, rows), lengths)


def _tf(conv, rows, lengths):
    return ConvertStage(conv, lengths, list(conv.TASK_FEATURES))(*_flat(conv, rows))


CONVERTERS = [
    lambda pack: dt.EncDecFeatureConverter(pack=pack),
    lambda pack: dt.EncDecFeatureConverter(pack=pack, bos_id=3),
    lambda pack: dt.LMFeatureConverter(pack=pack),
    lambda pack: dt.LMFeatureConverter(pack=pack, bos_id=7),
    lambda pack: dt.PrefixLMFeatureConverter(pack=pack),
    lambda pack: dt.PrefixLMFeatureConverter(pack=pack, loss_on_targets_only=False),
]


@pytest.mark.parametrize("make", CONVERTERS)
@pytest.mark.parametrize("pack", [True, False])
def test_numpy_conversion_equals_tensorflow(make, pack):
    conv = make(pack)
    assert conv.converts_numpy
    keys = list(conv.TASK_FEATURES)
    lengths = {"inputs": 24, "targets": 16}
    rows = _rows(keys, 7, 4 if pack else 1, seed=len(keys) + pack)
    want = _tf(conv, rows, lengths)
    got = _numpy(conv, rows, lengths)
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype == np.int32, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    assert want["decoder_target_tokens"].shape[0] == 7


def test_overlong_examples_are_trimmed_like_tensorflow():
    conv = dt.EncDecFeatureConverter(pack=False)
    lengths = {"inputs": 3, "targets": 2}
    rows = {"inputs": [[np.arange(2, 9, dtype=np.int32)]], "targets": [[np.arange(2, 6, dtype=np.int32)]]}
    got, want = _numpy(conv, rows, lengths), _tf(conv, rows, lengths)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_subclass_and_passthrough_fall_back_to_tensorflow():
    class Mine(dt.EncDecFeatureConverter):
        pass

    assert not Mine().converts_numpy
    assert not dt.LMFeatureConverter(passthrough_features=["extra"]).converts_numpy
    with pytest.raises(dt.DataTasksError, match="no NumPy conversion"):
        Mine().convert_numpy({}, np.ones(1), {"inputs": 2, "targets": 2})


def test_overflowing_row_is_refused():
    conv = dt.LMFeatureConverter(pack=True)
    rows = {"targets": [[np.arange(2, 8, dtype=np.int32), np.arange(2, 8, dtype=np.int32)]]}
    with pytest.raises(dt.DataTasksError, match="more than its length 8"):
        _numpy(conv, rows, {"targets": 8})
