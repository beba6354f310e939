"""`map_inline` and `pipeline_options`: same elements as `Dataset.map`, run inline when possible;
`no_autograph`: a marked function is traced as written, and maps built inside it still convert."""

import numpy as np
import pytest
import tensorflow as tf

import cairn.datatasks as dt
from cairn.datatasks import preprocessors as pp
from cairn.datatasks import tf_data
from cairn.tokenizers import ByteVocabulary


def elements(ds):
    return [
        {k: np.asarray(v).tolist() for k, v in x.items()} if isinstance(x, dict) else np.asarray(x).tolist()
        for x in ds.with_options(dt.pipeline_options()).as_numpy_iterator()
    ]


def ragged_source(n=40):
    return tf.data.Dataset.range(n).map(lambda i: {"ids": tf.range(i % 7, dtype=tf.int32), "n": i})


def is_inline(ds) -> bool:
    return getattr(ds, "_use_inter_op_parallelism", True) is False


def add_one(x):
    return {"ids": x["ids"] + 1, "n": x["n"] * 2}


def test_same_elements_as_map_and_runs_inline():
    ds = tf_data.map_inline(ragged_source(), add_one)
    assert is_inline(ds)
    assert elements(ds) == elements(ragged_source().map(add_one))


@pytest.mark.parametrize(
    "name, fn",
    [
        ("cond", lambda x: {"ids": tf.cond(x["n"] > 3, lambda: x["ids"], lambda: x["ids"] * 0), "n": x["n"]}),
        (
            "while",
            lambda x: {"ids": x["ids"], "n": tf.while_loop(lambda i: i < x["n"], lambda i: [i + 1], [x["n"] * 0])},
        ),
        ("tf.function call", lambda x: {"ids": tf.function(lambda v: v * 3)(x["ids"]), "n": x["n"]}),
        (
            "assert with int64 data",
            lambda x: (
                {"ids": x["ids"], "n": tf.identity(x["n"])}
                if tf.debugging.Assert(x["n"] >= 0, [x["n"]]) is not None
                else x
            ),
        ),
    ],
)
def test_control_flow_falls_back_to_a_parallel_map(name, fn):
    ds = tf_data.map_inline(ragged_source(), fn)
    assert not is_inline(ds), name
    assert elements(ds) == elements(ragged_source().map(fn)), name  # and it runs


def test_numpy_function_runs_inline():
    def fn(x):
        doubled = tf.numpy_function(lambda v: (v * 2).astype(np.int32), [x["ids"]], tf.int32, stateful=False)
        return {"ids": tf.ensure_shape(doubled, [None]), "n": x["n"]}

    ds = tf_data.map_inline(ragged_source(), fn)
    assert is_inline(ds)
    assert [e["ids"] for e in elements(ds)] == [[2 * v for v in range(i % 7)] for i in range(40)]


def test_inline_map_then_filter_then_batch_under_pipeline_options():
    # TF 2.21's map_and_filter_fusion mis-builds this chain ("Filter predicate `f` must
    # return a scalar bool"), and map_and_batch_fusion would run the map on a thread pool:
    # pipeline_options keeps both off.
    opt = dt.pipeline_options().experimental_optimization
    assert opt.map_and_filter_fusion is False and opt.map_and_batch_fusion is False
    assert opt.map_parallelization is False
    ds = tf_data.map_inline(ragged_source(), add_one).filter(lambda x: tf.size(x["ids"]) > 0)
    ds = tf_data.map_inline(ds, lambda x: {"ids": x["ids"][:3], "n": x["n"]})
    ds = ds.padded_batch(4)
    got = elements(ds)
    expected = [[i * 2 for i in range(40) if i % 7][j : j + 4] for j in range(0, 34, 4)]
    assert [b["n"] for b in got] == expected


def test_iterator_checkpoint_restores_through_inline_maps(tmp_path):
    ds = tf_data.map_inline(
        tf_data.map_inline(ragged_source(200), add_one).shuffle(16, seed=3),
        lambda x: {"ids": x["ids"], "n": x["n"] + 1},
    ).padded_batch(5)
    ds = ds.with_options(dt.pipeline_options())
    it = iter(ds)
    for _ in range(7):
        next(it)
    ckpt = tf.train.Checkpoint(it=it)
    path = ckpt.write(str(tmp_path / "it"))
    rest = [b["n"].numpy().tolist() for b in it]
    it2 = iter(ds)
    tf.train.Checkpoint(it=it2).read(path).assert_consumed()
    assert [b["n"].numpy().tolist() for b in it2] == rest


def test_map_over_dataset_inline_by_default_parallel_on_request():
    @dt.map_over_dataset
    def plus(x):
        return {"ids": x["ids"] + 5, "n": x["n"]}

    @dt.map_over_dataset(num_parallel_calls=tf.data.AUTOTUNE)
    def plus_parallel(x):
        return {"ids": x["ids"] + 5, "n": x["n"]}

    a, b = plus(ragged_source()), plus_parallel(ragged_source())
    assert is_inline(a) and not is_inline(b)
    assert elements(a) == elements(b)


def test_task_pipeline_carries_the_options():
    vocab = ByteVocabulary()
    task = dt.Task(
        "inline_opts",
        dt.FunctionDataSource(
            lambda split, shuffle_files, seed=None: tf.data.Dataset.from_tensor_slices({"targets": ["ab", "cde", "f"]}),
            splits=["train"],
        ),
        {"targets": dt.Feature(vocab)},
        [pp.tokenize, pp.append_eos],
    )
    ds = task.get_dataset({"targets": 8}, shuffle=False)
    assert ds.options().experimental_optimization.map_parallelization is False
    assert [x["targets"].tolist() for x in ds.as_numpy_iterator()] == [[100, 101, 1], [102, 103, 104, 1], [105, 1]]


def python_if_on_a_tensor(x):
    if x["n"] > 3:  # needs AutoGraph: a tensor as a Python bool
        return {"ids": x["ids"], "n": x["n"] - 3}
    return x


def test_no_autograph_traces_the_function_as_written():
    ds = ragged_source(8)
    converted = elements(ds.map(python_if_on_a_tensor))
    assert [x["n"] for x in converted] == [0, 1, 2, 3, 1, 2, 3, 4]
    marked = tf_data.no_autograph(lambda x: python_if_on_a_tensor(x))
    with pytest.raises(TypeError, match="tf.Tensor.*bool"):
        ds.map(marked)  # not converted: Python's `if` sees the symbolic tensor
    # Library functions marked in the pipeline still give the same elements.
    from cairn.datatasks import packing

    assert hasattr(packing.shift_right, "autograph_info__")
    shifted = elements(ds.map(lambda x: {"ids": packing.shift_right(x["ids"], 9)}))
    assert shifted[3]["ids"] == [9, 0, 1] and shifted[1]["ids"] == [9]


def test_maps_built_inside_a_marked_function_still_convert():
    @tf_data.no_autograph
    def build(ds):
        return ds.map(python_if_on_a_tensor)

    assert [x["n"] for x in elements(build(ragged_source(6)))] == [0, 1, 2, 3, 1, 2]
