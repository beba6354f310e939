"""Data sources: where a task's raw examples come from, split by split.

Every source maps split names to data, lists its shards (`list_shards`), knows
`num_input_examples` when it was told, and reads a split as a `tf.data.Dataset` for
one `ShardInfo`: whole files per shard when there are at least as many files as
shards, every `num_shards`-th example otherwise. File order is shuffled with a
seeded permutation when `shuffle=True`; nothing here uses an unseeded RNG. Files at a URL
(`gs://...`) are listed and read through `cairn.storage` (`url_sources`), local files by
tf.data's readers: the same examples in the same order either way.
"""

from __future__ import annotations

import abc
import dataclasses
import glob
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from cairn import storage
from cairn.datatasks import url_sources
from cairn.datatasks.errors import DataTasksError, unknown
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.stats import DataStats
from cairn.datatasks.tf_data import map_inline, no_autograph


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """This reader's shard: `index` of `num_shards`."""

    index: int
    num_shards: int

    def __post_init__(self):
        if not (isinstance(self.num_shards, int) and self.num_shards >= 1):
            raise DataTasksError(f"ShardInfo.num_shards must be an int >= 1, got {self.num_shards!r}")
        if not (isinstance(self.index, int) and 0 <= self.index < self.num_shards):
            raise DataTasksError(f"ShardInfo.index must be in [0, {self.num_shards}), got {self.index!r}")


class DataSource(metaclass=abc.ABCMeta):
    """Base class: splits, shards and a `get_dataset` per split."""

    def __init__(self, splits: Sequence[str], num_input_examples: Mapping[str, int] | None = None):
        self._splits = tuple(splits)
        self._num_input_examples = dict(num_input_examples or {})

    @property
    def splits(self) -> tuple[str, ...]:
        return self._splits

    def _check_split(self, split: str) -> None:
        if split not in self._splits:
            raise unknown("split", split, self._splits)

    def num_input_examples(self, split: str) -> int | None:
        """The number of raw examples in `split`, when known."""
        self._check_split(split)
        return self._num_input_examples.get(split)

    def list_shards(self, split: str) -> list[str]:
        """The shards (files) of `split`; a single pseudo-shard for non-file sources."""
        self._check_split(split)
        return [split]

    @abc.abstractmethod
    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
        stats: DataStats | None = None,
    ) -> tf.data.Dataset:
        """The raw examples of `split` for this shard."""


_GLOB_CHARS = "*?["


def pattern_root(pattern: str) -> str:
    """The root of a file pattern: its directory part before the first glob character.

    `/data/c4/train-*.txt` -> `/data/c4`; `/data/*/part-?.txt` -> `/data`;
    `/data/dev.txt` (no glob character) -> `/data`; `gs://b/x/*.json` -> `gs://b/x`;
    `*.txt` -> `` (names stay as matched).
    """
    cut = min([pattern.find(c) for c in _GLOB_CHARS if c in pattern] or [len(pattern)])
    head = pattern[:cut]
    if "/" not in head:
        return ""
    return head.rsplit("/", 1)[0] or "/"


def relative_name(path: str, root: str) -> str:
    """`path` relative to `root` (`/`-separated), as the fingerprint records it."""
    if not root:
        return path
    prefix = root.rstrip("/") + "/"
    if path.startswith(prefix):
        return path[len(prefix) :]
    if "://" not in path:
        return os.path.relpath(path, root).replace(os.sep, "/")
    raise DataTasksError(f"file {path!r} is not under the root {root!r} of its pattern")


@dataclasses.dataclass(frozen=True)
class SourceFile:
    """One file of a file source: the index of the pattern that matched it, its path, and
    its name relative to that pattern's root (what cache fingerprints record); `skip` and
    `take` (None: to the end) select a window of its examples (a sliced TFDS split)."""

    pattern: int
    path: str
    name: str
    skip: int = 0
    take: int | None = None

    @property
    def windowed(self) -> bool:
        return self.skip > 0 or self.take is not None


def _seeded_order(n: int, seed: int | None) -> np.ndarray:
    return np.random.default_rng(0 if seed is None else seed).permutation(n)


def glob_files(pattern: str) -> list[str]:
    """Files matching `pattern`: local ones with Python's glob (dot-files too, as
    `tf.io.gfile.glob`, so no TensorFlow is imported to list them), URLs through
    `cairn.storage` (`url_sources.glob`)."""
    if "://" not in pattern:
        return glob.glob(pattern, include_hidden=True)
    return url_sources.glob(pattern)


def list_files(split: str, patterns: Sequence[str]) -> list[SourceFile]:
    """The files of `split` matching `patterns`: sorted matches, pattern by pattern, each named
    relative to its pattern's root (`pattern_root`); a pattern matching nothing is an error."""
    files: list[SourceFile] = []
    for i, pattern in enumerate(patterns):
        matched = sorted(glob_files(pattern))
        if not matched:
            raise DataTasksError(f"split {split!r}: no file matches {pattern!r}")
        root = pattern_root(pattern)
        files += [SourceFile(i, path, relative_name(path, root)) for path in matched]
    return files


def records_dataset(path: tf.Tensor, file_format: str) -> tf.data.Dataset:
    """The records of one file (`path`, a string tensor) read through `cairn.storage`:
    `url_sources.FORMATS` `"lines"` (as `tf.data.TextLineDataset`) or `"tfrecord"` (as
    `tf.data.TFRecordDataset`, CRCs checked), handed to tf.data a batch at a time."""
    return tf.data.Dataset.from_generator(
        lambda p: url_sources.batches(p.decode(), file_format),
        output_signature=tf.TensorSpec([None], tf.string),
        args=(path,),
    ).unbatch()


class FileDataSource(DataSource):
    """A source reading files matched by a glob pattern (or a list of them) per split.

    Local files are read by `_read_file` (a tf.data reader). A split with a file at a URL
    (`gs://...`) is listed through `cairn.storage` and read by `_read_url_file`, which the
    text and TFRecord sources implement through `cairn.storage` too (`records_dataset`), so
    the emulator covers them; its default is `_read_file`.
    """

    def __init__(
        self,
        split_to_filepattern: Mapping[str, str | Sequence[str]],
        num_input_examples: Mapping[str, int] | None = None,
        cycle_length: int = 16,
    ):
        super().__init__(list(split_to_filepattern), num_input_examples)
        self._patterns = {k: ([v] if isinstance(v, str) else list(v)) for k, v in split_to_filepattern.items()}
        self._cycle_length = cycle_length

    def list_shards(self, split: str) -> list[str]:
        return [f.path for f in self.source_files(split)]

    def source_files(self, split: str) -> list[SourceFile]:
        """The files of `split` in shard order, each with its name relative to the root of
        the pattern that matched it (`pattern_root`): sorted matches, pattern by pattern."""
        self._check_split(split)
        return list_files(split, self._patterns[split])

    @abc.abstractmethod
    def _read_file(self, path: tf.Tensor) -> tf.data.Dataset: ...

    def _read_url_file(self, path: tf.Tensor) -> tf.data.Dataset:
        """The examples of one file of a split that has files at a URL."""
        return self._read_file(path)

    def _postprocess(self, ds: tf.data.Dataset, stats: DataStats | None) -> tf.data.Dataset:
        return ds

    def _read_window(
        self, read_file: Callable[..., tf.data.Dataset], path: tf.Tensor, skip: tf.Tensor, take: tf.Tensor
    ) -> tf.data.Dataset:
        """Examples `[skip, skip + take)` of one file (`take` -1: to its end), of `read_file(path)`."""
        return read_file(path).skip(skip).take(take)

    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
        stats: DataStats | None = None,
    ) -> tf.data.Dataset:
        files = self.source_files(split)
        urls = any(storage.is_url(f.path) for f in files)
        example_level = False
        if shard_info is not None and shard_info.num_shards > 1:
            if len(files) >= shard_info.num_shards:
                files = files[shard_info.index :: shard_info.num_shards]
            else:
                example_level = True
        if shuffle:
            files = [files[i] for i in _seeded_order(len(files), seed)]
        paths = [f.path for f in files]
        read_file = self._read_url_file if urls else self._read_file
        read: Callable[..., tf.data.Dataset] = read_file
        if any(f.windowed for f in files):  # each file's window: skip, then take (-1: all)
            ds = tf.data.Dataset.from_tensor_slices(
                (
                    paths,
                    np.array([f.skip for f in files], np.int64),
                    np.array([-1 if f.take is None else f.take for f in files], np.int64),
                )
            )
            read = lambda path, skip, take: self._read_window(read_file, path, skip, take)
        else:
            ds = tf.data.Dataset.from_tensor_slices(paths)
        if len(files) == 1 or not shuffle:
            ds = ds.flat_map(read)
        else:
            ds = ds.interleave(
                read, cycle_length=min(self._cycle_length, len(files)), block_length=1, deterministic=True
            )
        if example_level and shard_info is not None:
            ds = ds.shard(shard_info.num_shards, shard_info.index)
        return self._postprocess(ds, stats)


class TextLineDataSource(FileDataSource):
    """Text files, one example (a scalar string) per line, as in seqio.

    Empty (or all-whitespace) lines are skipped and counted as `empty_line`.
    """

    def __init__(
        self,
        split_to_filepattern: Mapping[str, str | Sequence[str]],
        skip_header_lines: int = 0,
        num_input_examples: Mapping[str, int] | None = None,
        skip_empty_lines: bool = True,
    ):
        super().__init__(split_to_filepattern, num_input_examples)
        self._skip_header_lines = skip_header_lines
        self._skip_empty = skip_empty_lines

    def _read_file(self, path):
        return tf.data.TextLineDataset(path).skip(self._skip_header_lines)

    def _read_url_file(self, path):
        return records_dataset(path, "lines").skip(self._skip_header_lines)

    def _postprocess(self, ds, stats):
        if not self._skip_empty:
            return ds
        return drop_empty_lines(ds, stats)


def drop_empty_lines(ds: tf.data.Dataset, stats: DataStats | None, batch: int = 512) -> tf.data.Dataset:
    """Drops empty or all-whitespace lines, counting them as `empty_line`.

    Works on batches of lines (a per-line `filter` costs a function call per line).
    """

    def record(lengths: np.ndarray) -> np.ndarray:
        mask = lengths > 0
        if not mask.all() and stats is not None:
            stats.add("empty_line", "", int((~mask).sum()))
        return mask

    @no_autograph
    def keep(lines):
        lengths = tf.strings.length(tf.strings.strip(lines))
        if stats is None:
            mask = lengths > 0
        else:  # the mask comes out of `record`, so the count cannot be pruned away
            mask = tf.numpy_function(record, [lengths], tf.bool, stateful=False)
            mask.set_shape([None])
        return tf.boolean_mask(lines, mask)

    return map_inline(ds.batch(batch), keep).unbatch()


class TFRecordFileSource(FileDataSource):
    """Base of the sources of TFRecord files: `self._reader` (a `reader_cls(path)`, or None:
    `tf.data.TFRecordDataset` for local files, `records_dataset` through `cairn.storage` at a
    URL; a custom `reader_cls` reads URLs itself)."""

    _reader: Callable[..., tf.data.Dataset] | None = None

    def _read_file(self, path):
        return (self._reader or tf.data.TFRecordDataset)(path)

    def _read_url_file(self, path):
        return records_dataset(path, "tfrecord") if self._reader is None else self._reader(path)


class TFExampleDataSource(TFRecordFileSource):
    """TFRecord files of serialized `tf.train.Example`s, parsed with `feature_description`."""

    def __init__(
        self,
        split_to_filepattern: Mapping[str, str | Sequence[str]],
        feature_description: Mapping[str, Any],
        num_input_examples: Mapping[str, int] | None = None,
        reader_cls: Callable[..., tf.data.Dataset] | None = None,
    ):
        super().__init__(split_to_filepattern, num_input_examples)
        self._description = dict(feature_description)
        self._reader = reader_cls  # None: tf.data.TFRecordDataset, or cairn.storage at a URL

    def _postprocess(self, ds, stats):
        return map_inline(ds, lambda r: tf.io.parse_single_example(r, self._description))


def pseudo_shards(split: str, num_shards: int) -> list[str]:
    """The shard names of a split that is not made of files: `split`, or `split-00000-of-0000N`."""
    return [split] if num_shards == 1 else [f"{split}-{i:05d}-of-{num_shards:05d}" for i in range(num_shards)]


class FunctionDataSource(DataSource):
    """A source from a function `dataset_fn(split, shuffle_files[, seed][, shard_info])`
    returning a `tf.data.Dataset`.

    A function that takes `shard_info` (a `ShardInfo`, or None for everything) reads only its
    shard (e.g. its files), and `num_shards` tells `list_shards` (and so the cache job, which
    writes one cache shard per source shard, in parallel) how many shards a split has. A
    function without `shard_info` is sharded example by example (every `num_shards`-th example
    of the whole stream) and has one shard per split.
    """

    def __init__(
        self,
        dataset_fn: Callable[..., tf.data.Dataset],
        splits: Sequence[str],
        num_input_examples: Mapping[str, int] | None = None,
        num_shards: int = 1,
    ):
        super().__init__(splits, num_input_examples)
        self._fn = dataset_fn
        params = inspect.signature(dataset_fn).parameters
        self._takes_seed = "seed" in params
        self._takes_shard_info = "shard_info" in params
        if not (isinstance(num_shards, int) and num_shards >= 1):
            raise DataTasksError(f"FunctionDataSource num_shards must be an int >= 1, got {num_shards!r}")
        if num_shards > 1 and not self._takes_shard_info:
            raise DataTasksError(
                f"FunctionDataSource num_shards={num_shards} needs a dataset_fn taking shard_info "
                f"(to read one shard); {getattr(dataset_fn, '__name__', dataset_fn)!r} does not"
            )
        self._num_shards = num_shards

    def list_shards(self, split: str) -> list[str]:
        self._check_split(split)
        return pseudo_shards(split, self._num_shards)

    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
        stats: DataStats | None = None,
    ) -> tf.data.Dataset:
        self._check_split(split)
        kwargs: dict[str, Any] = {"seed": seed} if self._takes_seed else {}
        if self._takes_shard_info:
            return self._fn(split=split, shuffle_files=shuffle, shard_info=shard_info, **kwargs)
        ds = self._fn(split=split, shuffle_files=shuffle, **kwargs)
        if shard_info is not None and shard_info.num_shards > 1:
            ds = ds.shard(shard_info.num_shards, shard_info.index)
        return ds
