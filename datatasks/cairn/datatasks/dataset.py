"""`get_dataset`: a task or mixture, preprocessed, converted and batched for a model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.feature_converters import EncDecFeatureConverter, FeatureConverter
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.mixture import Mixture
from cairn.datatasks.registry import Registry, get_mixture_or_task
from cairn.datatasks.sources import ShardInfo
from cairn.datatasks.stats import DataStats
from cairn.datatasks.task import Task
from cairn.datatasks.tf_data import pipeline_options


def get_dataset(
    mixture_or_task_name: str | Task | Mixture,
    task_feature_lengths: Mapping[str, int],
    feature_converter: FeatureConverter | None = None,
    dataset_split: str = "train",
    shuffle: bool = False,
    num_epochs: int | None = 1,
    shard_info: ShardInfo | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    registry: Registry | None = None,
    stats: DataStats | None = None,
    trim_output_features: bool = True,
    sequence_length: Mapping[str, int] | None = None,
) -> tf.data.Dataset:
    """Model-ready examples of a task or mixture (streaming mode; seqio's `get_dataset`).

    Args:
      mixture_or_task_name: a registered name, or a `Task` / `Mixture`.
      task_feature_lengths: `{"inputs": 512, "targets": 128}`; `sequence_length` is an alias.
      feature_converter: default `EncDecFeatureConverter(pack=True)`.
      dataset_split: the split to read.
      shuffle: shuffle files and examples (seeded).
      num_epochs: passes over the data; None repeats forever.
      shard_info: this reader's shard (files per shard when there are enough files).
      seed: the seed of every random choice; the same seed gives the same batches.
      batch_size: batch with `drop_remainder=True` when given.
      registry: where names are looked up (default: the global registry).
      stats: filled with the bad-data counts as the dataset is read.
    """
    lengths = dict(task_feature_lengths if task_feature_lengths is not None else (sequence_length or {}))
    if not lengths:
        raise DataTasksError("get_dataset needs task_feature_lengths, e.g. {'inputs': 512, 'targets': 128}")
    for k, n in lengths.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise DataTasksError(f"task_feature_lengths[{k!r}] must be an int >= 1 (room for one token), got {n!r}")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise DataTasksError(f"batch_size must be an int >= 1, got {batch_size!r}")
    obj: Any = mixture_or_task_name
    if isinstance(obj, str):
        obj = get_mixture_or_task(obj, registry)
    converter = feature_converter or EncDecFeatureConverter(pack=True)
    ds = obj.get_dataset(
        lengths,
        split=dataset_split,
        shuffle=shuffle,
        seed=seed,
        shard_info=shard_info,
        num_epochs=num_epochs,
        stats=stats,
        trim_output_features=trim_output_features,
    )
    ds = converter(ds, lengths)
    if batch_size:
        ds = ds.batch(batch_size, drop_remainder=True)
    return ds.with_options(pipeline_options())
