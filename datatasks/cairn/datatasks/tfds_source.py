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
from collections.abc import Sequence

from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.inline import map_inline
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.sources import TFExampleDataSource


def _resolve(name: str, data_dir: str) -> tuple[str, str]:
    """`"name/config:1.0.0"` -> (prepared folder, dataset name)."""
    base, _, version = name.partition(":")
    ds_name = base.split("/")[0]
    root = os.path.join(data_dir, base)
    if not tf.io.gfile.isdir(root):
        raise DataTasksError(
            f"TFDS dataset {name!r} is not prepared under {data_dir!r} (no folder {root}); "
            f"cairn does not download data: run `tfds build {base}` with "
            f"--data_dir={data_dir} on a machine that can, then copy the folder here"
        )
    if not version:
        versions = sorted(
            v
            for v in tf.io.gfile.listdir(root)
            if tf.io.gfile.exists(os.path.join(root, v.rstrip("/"), "dataset_info.json"))
        )
        if not versions:
            raise DataTasksError(f"TFDS dataset {name!r}: no prepared version under {root}")
        version = versions[-1].rstrip("/")
    folder = os.path.join(root, version)
    if not tf.io.gfile.exists(os.path.join(folder, "dataset_info.json")):
        raise DataTasksError(
            f"TFDS dataset {name!r}: {folder} has no dataset_info.json (not prepared, or preparation did not finish)"
        )
    return folder, ds_name


def _feature_description(path: str) -> dict:
    record = next(iter(tf.data.TFRecordDataset(path).take(1)), None)
    if record is None:
        raise DataTasksError(f"TFDS shard {path} is empty")
    example = tf.train.Example.FromString(record.numpy())
    out = {}
    for key, feat in example.features.feature.items():
        kind = feat.WhichOneof("kind")
        values = getattr(feat, kind).value
        dtype = {"bytes_list": tf.string, "int64_list": tf.int64, "float_list": tf.float32}[kind]
        out[key] = tf.io.FixedLenFeature([], dtype) if len(values) == 1 else tf.io.VarLenFeature(dtype)
    return out


class TfdsDataSource(TFExampleDataSource):
    """A prepared TFDS dataset (`"name/config:version"`) under `tfds_data_dir`."""

    def __init__(self, tfds_name: str, tfds_data_dir: str, splits: Sequence[str] | None = None):
        folder, ds_name = _resolve(tfds_name, tfds_data_dir)
        with tf.io.gfile.GFile(os.path.join(folder, "dataset_info.json")) as f:
            info = json.load(f)
        counts = {}
        for s in info.get("splits", []):
            counts[s["name"]] = sum(int(n) for n in s.get("shardLengths", []))
        names = list(splits) if splits else sorted(counts)
        patterns = {s: os.path.join(folder, f"{ds_name}-{s}.tfrecord*") for s in names}
        first = sorted(tf.io.gfile.glob(patterns[names[0]]))
        if not first:
            raise DataTasksError(f"TFDS dataset {tfds_name!r}: no records for split {names[0]!r} in {folder}")
        description = _feature_description(first[0])
        super().__init__(patterns, description, {s: counts[s] for s in names if s in counts})
        self._sparse = [k for k, v in description.items() if isinstance(v, tf.io.VarLenFeature)]

    def _postprocess(self, ds, stats):
        ds = super()._postprocess(ds, stats)
        sparse = self._sparse
        return map_inline(ds, lambda x: {k: (tf.sparse.to_dense(v) if k in sparse else v) for k, v in x.items()})
