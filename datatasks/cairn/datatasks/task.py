"""`Task`: a data source, preprocessors and output features, read as a `tf.data.Dataset`."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cairn.datatasks.errors import DataTasksError, FeatureTypeError
from cairn.datatasks.feature import Feature
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.preprocessors.base import cacheable_prefix, call_preprocessor
from cairn.datatasks.sources import DataSource, ShardInfo
from cairn.datatasks.stats import BadDataPolicy, DataStats
from cairn.datatasks.tf_data import pipeline_options
from cairn.datatasks.validation import finalize, validate_spec

_NAME = re.compile(r"^[\w:/\.\-]+$")


class Task:
    """A named dataset: `source` -> `preprocessors` -> validated `output_features`.

    Args:
      name: unique name (letters, digits, `_ : / . -`).
      source: a `DataSource`.
      output_features: `{name: Feature}`.
      preprocessors: functions `dataset -> dataset`, applied in order (see
        `preprocessors.base` for the arguments they may receive).
      postprocess_fn: maps decoded model output to the form the metrics take.
      metric_fns: metric functions for evaluation.
      metric_objs: seqio-style metric objects (`cairn.evaluation.Metric`: built from the
        model output, merged, computed) for evaluation, beside `metric_fns`.
      bad_data_policy: what to do with undecodable and over-long examples.
    """

    def __init__(
        self,
        name: str,
        source: DataSource,
        output_features: Mapping[str, Feature],
        preprocessors: Sequence[Callable] = (),
        postprocess_fn: Callable | None = None,
        metric_fns: Sequence[Callable] = (),
        bad_data_policy: BadDataPolicy | None = None,
        shuffle_buffer_size: int = 1000,
        metric_objs: Sequence[Any] = (),
    ):
        if not isinstance(name, str) or not _NAME.match(name):
            raise DataTasksError(f"task name must match {_NAME.pattern}, got {name!r}")
        if not isinstance(source, DataSource):
            raise DataTasksError(f"task {name!r}: source must be a DataSource, got {type(source).__name__}")
        for k, f in output_features.items():
            if not isinstance(f, Feature):
                raise DataTasksError(f"task {name!r}: output feature {k!r} must be a Feature, got {type(f).__name__}")
        for p in preprocessors:
            if not callable(p):
                raise DataTasksError(f"task {name!r}: preprocessor {p!r} is not callable")
        self.name = name
        self.source = source
        self.output_features = dict(output_features)
        self.preprocessors = tuple(preprocessors)
        self.postprocess_fn = postprocess_fn
        self.metric_fns = tuple(metric_fns)
        for m in metric_objs:
            if not (callable(getattr(m, "from_model_output", None)) and hasattr(m, "model_output_type")):
                raise DataTasksError(
                    f"task {name!r}: metric object {m!r} has no from_model_output/model_output_type (a Metric)"
                )
        self.metric_objs = tuple(metric_objs)
        self.bad_data_policy = bad_data_policy or BadDataPolicy()
        self.shuffle_buffer_size = shuffle_buffer_size

    def __repr__(self) -> str:
        return f"Task({self.name!r})"

    @property
    def splits(self) -> tuple[str, ...]:
        return self.source.splits

    def num_input_examples(self, split: str) -> int | None:
        return self.source.num_input_examples(split)

    @property
    def cacheable_preprocessors(self) -> tuple[Callable, ...]:
        """The leading preprocessors a cache may run (deterministic, no sequence_length)."""
        return self.preprocessors[: cacheable_prefix(self.preprocessors)]

    def preprocess(
        self,
        ds: tf.data.Dataset,
        sequence_length: Mapping[str, int] | None = None,
        seed: Any = None,
        stats: DataStats | None = None,
        start: int = 0,
        stop: int | None = None,
    ) -> tf.data.Dataset:
        """Applies preprocessors `[start:stop]`; seeded ones get keys from `seed`."""
        key = tf.convert_to_tensor([0, 0] if seed is None else seed, tf.int64)
        if key.shape.rank == 0:
            key = tf.stack([key, tf.constant(0, tf.int64)])
        for pos, fn in list(enumerate(self.preprocessors))[start:stop]:
            try:
                ds = call_preprocessor(
                    fn,
                    ds,
                    output_features=self.output_features,
                    sequence_length=sequence_length,
                    seed=tf.random.experimental.stateless_fold_in(key, pos),
                    bad_data_policy=self.bad_data_policy,
                    stats=stats,
                )
            except FeatureTypeError as e:
                name = getattr(fn, "__name__", repr(fn))
                raise FeatureTypeError(f"task {self.name!r}, preprocessor {name!r}: {e}") from None
            if not isinstance(ds, tf.data.Dataset):
                raise DataTasksError(
                    f"task {self.name!r}: preprocessor {pos} ({fn!r}) returned "
                    f"{type(ds).__name__}, not a tf.data.Dataset"
                )
        return ds

    def get_dataset(
        self,
        sequence_length: Mapping[str, int] | None = None,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
        num_epochs: int | None = 1,
        shuffle_buffer_size: int | None = None,
        stats: DataStats | None = None,
        trim_output_features: bool = True,
    ) -> tf.data.Dataset:
        """The task's preprocessed examples.

        The stream is a pure function of `seed`: the file order, the shuffle buffer and the
        seeds of random preprocessors (from `(seed, epoch, preprocessor, example index)`,
        so every epoch draws new noise) all derive from it. The shuffle buffer spans epoch
        boundaries. `num_epochs=None` repeats forever.
        """
        seed = 0 if seed is None else int(seed)
        if sequence_length is not None:
            for k, n in sequence_length.items():
                if n is not None and (not isinstance(n, int) or n < 1):
                    raise DataTasksError(f"task {self.name!r}: sequence_length[{k!r}] must be an int >= 1, got {n!r}")
        if num_epochs is not None and (not isinstance(num_epochs, int) or num_epochs < 1):
            raise DataTasksError(
                f"task {self.name!r}: num_epochs must be None (forever) or an int >= 1, got {num_epochs!r}"
            )
        buffer = shuffle_buffer_size or self.shuffle_buffer_size

        def epoch(e: tf.Tensor) -> tf.data.Dataset:
            ds = self.source.get_dataset(split, shuffle=shuffle, seed=seed, shard_info=shard_info, stats=stats)
            ds = self.preprocess(ds, sequence_length, seed=tf.stack([tf.constant(seed, tf.int64), e]), stats=stats)
            validate_spec(self.name, ds, self.output_features)
            return finalize(
                self.name,
                ds,
                self.output_features,
                sequence_length if trim_output_features else None,
                self.bad_data_policy.overlong,
                stats,
            )

        if num_epochs == 1:
            ds = epoch(tf.constant(0, tf.int64))
        else:
            count = -1 if num_epochs is None else int(num_epochs)
            # Not converted by autograph (nothing to convert), so a preprocessor's error
            # reaches the caller as itself, not wrapped in a StagingError.
            per_epoch = tf.autograph.experimental.do_not_convert(epoch)
            ds = tf.data.Dataset.range(count if count >= 0 else 2**62).flat_map(per_epoch)
        if shuffle:
            # Outside the per-epoch function: a shuffle inside flat_map cannot be checkpointed.
            ds = ds.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
        return ds.with_options(pipeline_options())
