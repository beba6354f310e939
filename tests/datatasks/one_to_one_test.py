"""One-to-one random preprocessors for deterministic pipelines: `span_corruption_one_to_one`
(T5 noise after a cache of fixed-length chunks) and `random_crop`; their length functions
match what they produce, their noise is seeded, and they run after a deterministic cache."""

import functools

import numpy as np
import pytest
import tensorflow as tf
from data_util import ids_vocab

import cairn.datatasks as dt
from cairn.datatasks import preprocessors as pp
from cairn.datatasks.deterministic import plan as plan_lib

VOCAB = 1000
FEATS = {"inputs": dt.Feature(ids_vocab(VOCAB)), "targets": dt.Feature(ids_vocab(VOCAB))}


def chunks(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB - 100, size=n).astype(np.int32) for n in lengths]


def run(fn, docs, lengths, seed=0, feats=FEATS):
    rows = tf.RaggedTensor.from_row_lengths(np.concatenate(docs), [len(d) for d in docs])
    ds = tf.data.Dataset.from_tensor_slices({"targets": rows}).map(dict)
    return list(fn(ds, sequence_length=lengths, output_features=feats, seed=seed).as_numpy_iterator())


def test_span_corruption_one_to_one_keeps_one_example_per_record_and_t5_noise():
    docs = chunks([512] * 200 + [40, 5, 2, 1])
    out = run(pp.span_corruption_one_to_one, docs, {"inputs": 64, "targets": 16})
    assert len(out) == len(docs)
    sentinel_min = VOCAB - 100
    for doc, ex in zip(docs, out):
        inputs, targets = ex["inputs"], ex["targets"]
        assert inputs[0] != targets[0] or len(doc) < 2
        # Reassembling inputs and targets gives back a window of the record.
        pieces, spans = [], {}
        cur = None
        for t in targets:
            if t >= sentinel_min:
                cur = int(t)
                spans[cur] = []
            else:
                spans[cur].append(int(t))
        for t in inputs:
            pieces += spans.get(int(t), []) if t >= sentinel_min else [int(t)]
        window = np.asarray(pieces)
        n = len(window)
        assert n == min(len(doc), 70)  # random_spans_helper(64) = (70, 14)
        starts = [s for s in range(len(doc) - n + 1) if np.array_equal(doc[s : s + n], window)]
        assert starts, "not a window of the record"
    full = [ex for doc, ex in zip(docs, out) if len(doc) == 512]
    assert {len(ex["inputs"]) for ex in full} == {63} and {len(ex["targets"]) for ex in full} == {13}  # + EOS = 64, 14
    assert len({tuple(ex["inputs"][:5]) for ex in full}) > 150  # random crops


def test_span_corruption_one_to_one_is_seeded():
    docs = chunks([300] * 20)
    a = run(pp.span_corruption_one_to_one, docs, {"inputs": 32, "targets": 12}, seed=1)
    b = run(pp.span_corruption_one_to_one, docs, {"inputs": 32, "targets": 12}, seed=1)
    c = run(pp.span_corruption_one_to_one, docs, {"inputs": 32, "targets": 12}, seed=2)
    assert all(np.array_equal(x["inputs"], y["inputs"]) for x, y in zip(a, b))
    assert not all(np.array_equal(x["inputs"], y["inputs"]) for x, y in zip(a, c))


@pytest.mark.parametrize(
    "fn,lengths",
    [
        (pp.span_corruption_one_to_one, {"inputs": 64, "targets": 16}),
        (pp.span_corruption_one_to_one, {"inputs": 20, "targets": 8}),
        (pp.random_crop, {"targets": 33}),
        (pp.prefix_lm_one_to_one, {"inputs": 20, "targets": 8}),
    ],
)
def test_length_functions_match_the_outputs(fn, lengths):
    sizes = [1, 2, 3, 4, 5, 7, 10, 19, 20, 21, 33, 50, 69, 70, 71, 200, 512]
    docs = chunks(sizes)
    feats = FEATS if "inputs" in lengths else {"targets": dt.Feature(ids_vocab(VOCAB))}
    out = run(fn, docs, lengths, feats=feats)
    planned = plan_lib.output_lengths(fn)({"targets": np.asarray(sizes)}, lengths, feats)
    for k in lengths:
        assert [len(ex[k]) for ex in out] == planned[k].tolist(), k


def test_span_corruption_one_to_one_refuses_short_targets():
    assert pp.span_corruption_one_to_one.check_sequence_length({"inputs": 64, "targets": 16}) is None
    assert "targets >= 14" in pp.span_corruption_one_to_one.check_sequence_length({"inputs": 64, "targets": 8})
    with pytest.raises(ValueError, match="needs targets >= 14"):
        run(pp.span_corruption_one_to_one, chunks([100]), {"inputs": 64, "targets": 8})


def test_random_crop_windows():
    docs = chunks([100] * 30 + [10])
    out = run(pp.random_crop, docs, {"targets": 17}, feats={"targets": dt.Feature(ids_vocab(VOCAB))})
    assert [len(ex["targets"]) for ex in out] == [16] * 30 + [10]  # room for EOS
    starts = set()
    for doc, ex in zip(docs, out):
        s = [
            i
            for i in range(len(doc) - len(ex["targets"]) + 1)
            if np.array_equal(doc[i : i + len(ex["targets"])], ex["targets"])
        ]
        assert s
        starts.add(s[0])
    assert len(starts) > 10


def test_after_a_deterministic_cache_packed_and_unpacked(tmp_path):
    from cairn.datatasks.deterministic import DeterministicReader, cache_task_in_process, task_dir

    vocab = ids_vocab(VOCAB)
    docs = chunks([int(n) for n in np.random.default_rng(3).integers(30, 400, 60)], seed=4)

    def source_fn(split, shuffle_files):
        rows = tf.RaggedTensor.from_row_lengths(np.concatenate(docs), [len(d) for d in docs])
        return tf.data.Dataset.from_tensor_slices({"targets": rows}).map(dict)

    task = dt.Task(
        "one_to_one_t",
        dt.FunctionDataSource(source_fn, splits=["train"]),
        output_features={"inputs": dt.Feature(vocab), "targets": dt.Feature(vocab)},
        preprocessors=[
            functools.partial(pp.split_tokens, max_tokens_per_segment=128),
            pp.span_corruption_one_to_one,
            pp.append_eos_after_trim,
        ],
    )
    assert len(task.cacheable_preprocessors) == 1
    cache_task_in_process(task, "train", task_dir(str(tmp_path), task.name, "train"))
    lengths = {"inputs": 32, "targets": 12}
    for pack in (False, True):
        reader = DeterministicReader(
            task,
            str(tmp_path),
            seed=5,
            global_batch_size=4,
            sequence_length=lengths,
            feature_converter=dt.EncDecFeatureConverter(pack=pack),
            prefetch=0,
        )
        a = [next(reader)]
        state = reader.get_state()
        a += [next(reader) for _ in range(2)]
        assert state["step"] == 1
        reader.set_state(state)
        again = next(reader)
        assert all(np.array_equal(a[1][k], again[k]) for k in again)
        assert a[0]["encoder_input_tokens"].shape == (4, 32)
        assert (a[0]["encoder_input_tokens"] >= VOCAB - 100).any()  # sentinels
