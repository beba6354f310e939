"""`ragged.Ragged` operations and the one packer (`packing.pack_rows` / `pack_group`)
against plain per-example reference code."""

import numpy as np
import pytest
import tensorflow as tf

from cairn.datatasks import packing
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.ragged import Ragged, concat


def _examples(rng, n, most=6, low=0):
    return [rng.integers(low, 5, size=rng.integers(0, most)).astype(np.int32) for _ in range(n)]


def test_ragged_operations_match_lists():
    rng = np.random.default_rng(0)
    rows = _examples(rng, 40)
    r = Ragged.from_list(rows)
    assert [list(x) for x in r.to_list()] == [list(x) for x in rows]
    cut = rng.integers(0, 6, size=len(rows))
    assert [list(x) for x in r.head(cut).to_list()] == [list(x[:c]) for x, c in zip(rows, cut)]
    assert [list(x) for x in r.head(2).to_list()] == [list(x[:2]) for x in rows]
    assert [list(x) for x in r.append(9).to_list()] == [list(x) + [9] for x in rows]
    order = rng.permutation(len(rows))[:17]
    assert [list(x) for x in r.take(order).to_list()] == [list(rows[i]) for i in order]
    padded = r.padded(4)
    assert padded.shape == (40, 4)
    for x, p in zip(rows, padded):
        assert list(p) == list(x[:4]) + [0] * (4 - len(x[:4]))
    both = concat([r, r.head(1)])
    assert len(both) == 80 and [list(x) for x in both.to_list()[40:]] == [list(x[:1]) for x in rows]


def _reference_pack_group(batch, lengths):
    """seqio's greedy packing of one padded group, example by example (the semantics)."""
    keys = list(lengths)
    rows, partial, used = [], {k: [] for k in keys}, dict.fromkeys(keys, 0)
    for i in range(batch[keys[0]].shape[0]):
        one = {k: batch[k][i][: int(np.count_nonzero(batch[k][i]))][: lengths[k]] for k in keys}
        if any(used[k] + len(one[k]) > lengths[k] for k in keys):
            rows.append(partial)
            partial, used = {k: [] for k in keys}, dict.fromkeys(keys, 0)
        for k in keys:
            partial[k].append(one[k])
            used[k] += len(one[k])
    if batch[keys[0]].shape[0]:
        rows.append(partial)
    out = {}
    for k in keys:
        tokens = np.zeros((len(rows), lengths[k]), np.int32)
        positions = np.zeros((len(rows), lengths[k]), np.int32)
        for r, row in enumerate(rows):
            at = 0
            for seq in row[k]:
                tokens[r, at : at + len(seq)] = seq
                positions[r, at : at + len(seq)] = np.arange(len(seq))
                at += len(seq)
        out[k] = tokens
        out[k + "_positions"] = positions
        out[k + "_segment_ids"] = np.cumsum(positions == 0, axis=1, dtype=np.int32) * (tokens != 0)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_pack_group_matches_the_reference(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 14))
    lengths = {"inputs": int(rng.integers(1, 12)), "targets": int(rng.integers(1, 9))}
    # Padded groups with zeros inside examples too (cut at their count of non-zero ids).
    batch = {k: rng.integers(0, 4, size=(n, int(rng.integers(1, 14)))).astype(np.int32) for k in lengths}
    got, want = packing.pack_group(batch, lengths), _reference_pack_group(batch, lengths)
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == np.int32
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_pack_rows_refuses_an_overflowing_row():
    ex = {"targets": Ragged.from_list([np.arange(1, 6), np.arange(1, 5)])}
    with pytest.raises(DataTasksError, match="needs 9 'targets' ids, more than its length 8"):
        packing.pack_rows(ex, np.array([2]), {"targets": 8})


def test_autoregressive_inputs_match_tensorflow():
    rng = np.random.default_rng(3)
    targets = rng.integers(0, 9, size=(5, 12)).astype(np.int32)
    segments = np.sort(rng.integers(0, 4, size=(5, 12)), axis=1).astype(np.int32)
    for seg in (None, segments):
        for bos in (0, 7):
            got = packing.autoregressive_inputs(targets, seg, bos)
            for r in range(5):
                want = packing.make_autoregressive_inputs(
                    tf.constant(targets[r]), None if seg is None else tf.constant(seg[r]), bos
                ).numpy()
                np.testing.assert_array_equal(got[r], want)
