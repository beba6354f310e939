"""`TfdsDataSource`: a TFDS dataset already prepared on disk, read without tensorflow_datasets.

Cairn never downloads: the dataset must have been prepared (`tfds build`) under
`data_dir/<name>/<config>/<version>/`. Its `dataset_info.json` gives the splits and their
example counts; records are `tf.train.Example`s whose feature types are read from the
first record (bytes -> tf.string, int64 -> tf.int64, float -> tf.float32; one value gives a
scalar, more a 1-D tensor). Features that TFDS encodes specially (images, nested
sequences) need `TFExampleDataSource` with an explicit feature description.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

from cairn import storage
from cairn.datatasks import split_slicing, url_sources
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.sources import SourceFile, TFExampleDataSource, glob_files
from cairn.datatasks.tf_data import map_inline


def _resolve(name: str, data_dir: str) -> tuple[str, str]:
    """`"name/config:1.0.0"` -> (prepared folder, dataset name)."""
    base, _, version = name.partition(":")
    ds_name = base.split("/")[0]
    root = os.path.join(data_dir, base)
    if not url_sources.is_dir(root):
        raise DataTasksError(
            f"TFDS dataset {name!r} is not prepared under {data_dir!r} (no folder {root}); "
            f"cairn does not download data: run `tfds build {base}` with "
            f"--data_dir={data_dir} on a machine that can, then copy the folder here"
        )
    if not version:
        versions = sorted(
            v for v in url_sources.list_dir(root) if url_sources.exists(os.path.join(root, v, "dataset_info.json"))
        )
        if not versions:
            raise DataTasksError(f"TFDS dataset {name!r}: no prepared version under {root}")
        version = versions[-1]
    folder = os.path.join(root, version)
    if not url_sources.exists(os.path.join(folder, "dataset_info.json")):
        raise DataTasksError(
            f"TFDS dataset {name!r}: {folder} has no dataset_info.json (not prepared, or preparation did not finish)"
        )
    return folder, ds_name


def _first_record(path: str) -> bytes | None:
    if storage.is_url(path):
        with url_sources.open_binary(path) as f:
            return next(url_sources.iter_tfrecords(f, path), None)
    record = next(iter(tf.data.TFRecordDataset(path).take(1)), None)
    return None if record is None else record.numpy()


def _feature_description(path: str) -> dict:
    record = _first_record(path)
    if record is None:
        raise DataTasksError(f"TFDS shard {path} is empty")
    example = tf.train.Example.FromString(record)
    out = {}
    for key, feat in example.features.feature.items():
        kind = feat.WhichOneof("kind")
        values = getattr(feat, kind).value
        dtype = {"bytes_list": tf.string, "int64_list": tf.int64, "float_list": tf.float32}[kind]
        out[key] = tf.io.FixedLenFeature([], dtype) if len(values) == 1 else tf.io.VarLenFeature(dtype)
    return out


class TfdsDataSource(TFExampleDataSource):
    """A prepared TFDS dataset (`"name/config:version"`) under `tfds_data_dir`.

    `splits`: None (every split of the dataset), split specs (each its own name), or a mapping
    from the task's split names to specs. A spec may slice and join splits as TFDS does
    (`train[:90%]`, `train[10%:]`, `train[:1000]`, `train[-1%:]`, `train[:2shard]`,
    `train[:5%]+validation`; `cairn.datatasks.split_slicing`), using the per-shard example
    counts (`shardLengths`) of `dataset_info.json`.
    """

    def __init__(
        self,
        tfds_name: str,
        tfds_data_dir: str,
        splits: Sequence[str] | Mapping[str, str] | None = None,
    ):
        specs = None if splits is None else dict(splits) if isinstance(splits, Mapping) else {s: s for s in splits}
        for spec in (specs or {}).values():
            split_slicing.parse(spec)  # a spec that does not parse is named before any file is read
        folder, ds_name = _resolve(tfds_name, tfds_data_dir)
        info = json.loads(storage.read_text(os.path.join(folder, "dataset_info.json")))
        self._name, self._folder, self._ds_name = tfds_name, folder, ds_name
        self._lengths = {s["name"]: [int(n) for n in s.get("shardLengths", [])] for s in info.get("splits", [])}
        if specs is None:
            specs = {n: n for n in sorted(self._lengths)}
        self._specs = specs
        self._windows: dict[str, list[split_slicing.FileWindow] | None] = {}
        counts = {}
        for name, spec in specs.items():
            if split_slicing.is_sliced(spec):
                known = {k: v for k, v in self._lengths.items() if v}
                windows = split_slicing.resolve(spec, known)
                self._windows[name] = windows
                counts[name] = sum(w.take for w in windows)
            else:
                self._windows[name] = None
                if self._lengths.get(spec):
                    counts[name] = sum(self._lengths[spec])
        patterns = {name: [self._pattern(p.name) for p in split_slicing.parse(spec)] for name, spec in specs.items()}
        super().__init__(patterns, {}, counts)
        first = self.source_files(next(iter(specs)))
        self._description = _feature_description(first[0].path)
        self._sparse = [k for k, v in self._description.items() if isinstance(v, tf.io.VarLenFeature)]

    def _pattern(self, split: str) -> str:
        return os.path.join(self._folder, f"{self._ds_name}-{split}.tfrecord*")

    def source_files(self, split: str) -> list[SourceFile]:
        """The files of `split`; for a sliced spec, only the files it touches, each with its
        window of examples (none when the whole file is selected)."""
        self._check_split(split)
        windows = self._windows[split]
        if windows is None:
            files = super().source_files(split)
            if not files:
                raise DataTasksError(f"TFDS dataset {self._name!r}: no records for split {split!r} in {self._folder}")
            return files
        out, listed = [], {}
        for w in windows:
            if w.split not in listed:
                listed[w.split] = sorted(glob_files(self._pattern(w.split)))
                if len(listed[w.split]) != len(self._lengths[w.split]):
                    raise DataTasksError(
                        f"TFDS dataset {self._name!r} split {w.split!r}: dataset_info.json lists "
                        f"{len(self._lengths[w.split])} shards, {len(listed[w.split])} files match in {self._folder}"
                    )
            path = listed[w.split][w.file]
            whole = w.skip == 0 and w.take == self._lengths[w.split][w.file]
            out.append(
                SourceFile(w.part, path, os.path.basename(path), 0 if whole else w.skip, None if whole else w.take)
            )
        return out

    def _postprocess(self, ds, stats):
        ds = super()._postprocess(ds, stats)
        sparse = self._sparse
        return map_inline(ds, lambda x: {k: (tf.sparse.to_dense(v) if k in sparse else v) for k, v in x.items()})
