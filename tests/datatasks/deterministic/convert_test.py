"""ConvertStage: the fast packed path equals the converter run on each row alone."""

import numpy as np
import pytest

import cairn.datatasks as dt
from cairn.datatasks.deterministic.convert import ConvertStage


def _rows(keys, n_rows, per_row, seed=0):
    rng = np.random.default_rng(seed)
    return {
        k: [
            [
                rng.integers(2, 50, size=rng.integers(0 if k == "inputs" else 1, 4)).astype(np.int32)
                for _ in range(per_row)
            ]
            for _ in range(n_rows)
        ]
        for k in keys
    }


@pytest.mark.parametrize(
    "make",
    [
        lambda: dt.EncDecFeatureConverter(pack=True),
        lambda: dt.EncDecFeatureConverter(pack=True, bos_id=3),
        lambda: dt.LMFeatureConverter(pack=True),
    ],
)
def test_prepacked_equals_per_row(make):
    conv = make()
    keys = list(conv.TASK_FEATURES)
    lengths = {"inputs": 24, "targets": 16}
    rows = _rows(keys, 6, 4)
    fast = ConvertStage(conv, lengths, keys)
    slow = ConvertStage(conv, lengths, keys, per_row=True)
    assert fast.mode == "prepacked" and slow.mode == "per_row"
    a, b = fast(rows), slow(rows)
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert a[sorted(a)[0]].shape[0] == 6


def test_prefix_lm_runs_per_row_and_unpacked_per_example():
    conv = dt.PrefixLMFeatureConverter(pack=True)
    lengths = {"inputs": 10, "targets": 6}
    rows = _rows(["inputs", "targets"], 3, 2)
    stage = ConvertStage(conv, lengths, ["inputs", "targets"])
    assert stage.mode == "per_row"
    out = stage(rows)
    assert out["decoder_target_tokens"].shape == (3, 16)
    assert out["decoder_segment_ids"].max(axis=1).tolist() == [2, 2, 2]
    plain = ConvertStage(dt.EncDecFeatureConverter(pack=False), lengths, ["inputs", "targets"])
    one = _rows(["inputs", "targets"], 5, 1)
    out = plain(one)
    assert out["encoder_input_tokens"].shape == (5, 10)
    np.testing.assert_array_equal(out["decoder_target_tokens"][2, : len(one["targets"][2][0])], one["targets"][2][0])
