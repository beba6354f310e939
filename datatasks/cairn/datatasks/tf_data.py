"""`map_inline`: a `tf.data` map whose function runs in the thread that asks for the element.

A plain `Dataset.map` runs its function's kernels on TensorFlow's inter-op thread pool, and
tf.data's default `map_parallelization` turns it into a parallel map on a second pool. For
the small functions a data pipeline is made of (slice a few features, append an EOS, cast,
make decoder inputs) the thread hand-offs cost far more than the work: ~20-45 µs per
element against ~1 µs inline on the 2-core machines this project is measured on
(`benchmarks/datatasks_bench.py`; see the datatasks README). `map_inline` builds the map
with tf.data's single-threaded executor instead, which is what tf.data itself does for its
internal helper maps. Elements, order and checkpoints are exactly those of `ds.map(fn)`.

The single-threaded executor cannot run old-style control flow or nested function calls;
when `fn`'s graph has any (a `tf.cond`, `tf.while_loop`, a call into a `tf.function`, an
`Assert` whose data is not all strings or int32), the ordinary parallel map is used
instead. The pipeline must carry `pipeline_options()` (`get_dataset` adds them) so tf.data
does not re-parallelize it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from cairn.datatasks.lazy_tf import tf

_F = TypeVar("_F", bound=Callable)


def no_autograph(fn: _F) -> _F:
    """Marks `fn` so that `tf.data` (and `tf.function`) call it as written instead of having
    AutoGraph rewrite its source first.

    For a function made only of TensorFlow ops, with Python control flow on Python values
    only, AutoGraph's rewrite changes nothing but costs ~0.03-1 s per function per process
    (it parses and transforms the source): several seconds for every process that builds a
    text pipeline. Functions called from `fn` are not rewritten either, so `fn` must not call
    code the library does not own (a user's preprocessor or vocabulary): those keep
    AutoGraph. Unlike `tf.autograph.experimental.do_not_convert`, the mark neither imports
    TensorFlow nor switches AutoGraph off for maps built inside `fn`. The mark is
    TensorFlow's own (`autograph_info__`, what its `autograph_artifact` sets);
    `tests/datatasks/tf_data_test.py` checks that it still works.
    """
    fn.autograph_info__ = None  # type: ignore[attr-defined]
    return fn


@functools.cache
def _map_dataset_class() -> type | None:
    """TensorFlow's `_MapDataset` (the flag is not in the public `Dataset.map` signature)."""
    try:
        from tensorflow.python.data.ops import map_op

        return map_op._MapDataset  # pylint: disable=protected-access
    except (ImportError, AttributeError):  # pragma: no cover - other TensorFlow versions
        return None


# Ops the single-threaded executor rejects (control flow is lowered to Switch/Merge) or
# that run nested functions, whose bodies are not inspected here.
_NOT_INLINE = frozenset(
    {
        "If",
        "StatelessIf",
        "While",
        "StatelessWhile",
        "Case",
        "StatelessCase",
        "Switch",
        "Merge",
        "RefSwitch",
        "Enter",
        "Exit",
        "NextIteration",
        "LoopCond",
        "PartitionedCall",
        "StatefulPartitionedCall",
        "SymbolicGradient",
    }
)


def runs_inline(graph: tf.Graph) -> bool:
    """Whether a traced function graph can run on the single-threaded executor."""
    return not any(op.type in _NOT_INLINE for op in graph.get_operations())


def map_inline(ds: tf.data.Dataset, fn: Callable) -> tf.data.Dataset:
    """`ds.map(fn)` run in the calling thread; a parallel map when `fn` cannot be inlined."""
    map_dataset = _map_dataset_class()
    if map_dataset is not None:
        mapped = map_dataset(ds, fn, use_inter_op_parallelism=False, preserve_cardinality=True)
        if runs_inline(mapped._map_func.function.graph):  # pylint: disable=protected-access
            return mapped
    return ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def pipeline_options() -> tf.data.Options:
    """Options every cairn pipeline runs with.

    Fuses consecutive maps and consecutive filters (fewer per-element calls; same
    elements, same order), keeps inline maps inline (`map_parallelization` off) and the
    order fixed. `map_and_filter_fusion` stays off: in TensorFlow 2.21 it mis-builds the
    filter of an inline map followed by a filter ("Filter predicate `f` must return a
    scalar bool"; `tests/datatasks/tf_data_test.py`).
    """
    options = tf.data.Options()
    opt = options.experimental_optimization
    opt.map_fusion = True
    opt.filter_fusion = True
    opt.map_and_filter_fusion = False
    opt.map_and_batch_fusion = False  # the fused op is parallel: it would undo the inlining
    opt.map_parallelization = False
    opt.parallel_batch = True
    options.deterministic = True
    return options
