"""`ConvertStage`: planned rows of examples -> model features, with the task's converter.

Three ways, all giving the converter's own output for each planned row:
* unpacked: the converter (pack=False) over the step's examples, one `tf.data` pass;
* packed `EncDecFeatureConverter` / `LMFeatureConverter`: each row is packed with
  `packing.pack_group` (the converters' packing code; the plan guarantees one row), then a
  pack=False copy of the converter, given the packing features as passthrough features,
  computes the model features (it reads `targets_segment_ids` when present, as packed
  conversion does); the packing features are renamed to the model's names;
* any other packed converter: the converter alone on each row's examples (slower).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf

from cairn.datatasks import packing
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.feature_converters import EncDecFeatureConverter, FeatureConverter, LMFeatureConverter
from cairn.datatasks.inline import map_inline, pipeline_options

_RENAMES = {
    EncDecFeatureConverter: {
        "inputs_segment_ids": "encoder_segment_ids",
        "targets_segment_ids": "decoder_segment_ids",
        "inputs_positions": "encoder_positions",
        "targets_positions": "decoder_positions",
    },
    LMFeatureConverter: {"targets_segment_ids": "decoder_segment_ids", "targets_positions": "decoder_positions"},
}

Rows = Mapping[str, Sequence[Sequence[np.ndarray]]]


def _ragged(per_row: Sequence[Sequence[np.ndarray]], nested: bool) -> tf.RaggedTensor:
    flat = [e for row in per_row for e in row]
    values = np.concatenate(flat).astype(np.int32) if flat else np.zeros([0], np.int32)
    lengths = [np.array([len(e) for e in flat], np.int64)]
    if nested:
        lengths.insert(0, np.array([len(r) for r in per_row], np.int64))
    return tf.RaggedTensor.from_nested_row_lengths(values, lengths, validate=False)


class ConvertStage:
    """Converts this host's planned rows; `__call__` returns `{model feature: [rows, L]}`."""

    def __init__(
        self,
        converter: FeatureConverter,
        sequence_length: Mapping[str, int],
        keys: Sequence[str],
        per_row: bool = False,
    ):
        self.keys = list(keys)
        self.lengths = {k: sequence_length[k] for k in self.keys}
        lengths = dict(sequence_length)
        kind = type(converter)
        if not converter.pack:
            self.mode = "examples"
        elif kind in _RENAMES and not per_row:
            self.mode = "prepacked"
            self.renames = _RENAMES[kind]
            converter = kind(pack=False, bos_id=converter.bos_id, passthrough_features=list(self.renames))
        else:
            self.mode = "per_row"
        ragged = tf.RaggedTensorSpec([None, None], tf.int32, ragged_rank=1)
        nested = tf.RaggedTensorSpec([None, None, None], tf.int32, ragged_rank=2)

        if self.mode == "examples":
            spec = {k: ragged for k in self.keys}

            def build(x):
                ds = map_inline(tf.data.Dataset.from_tensor_slices(x), lambda e: dict(e))
                return converter(ds, lengths)
        elif self.mode == "prepacked":
            spec = {
                k: tf.TensorSpec([None, self.lengths[k.split("_")[0] if k not in self.lengths else k]], tf.int32)
                for k in self.keys + list(self.renames)
            }

            def build(x):
                return converter(tf.data.Dataset.from_tensor_slices(x), lengths)
        else:
            spec = {k: nested for k in self.keys}

            def one_row(row):
                ds = map_inline(tf.data.Dataset.from_tensor_slices(row), lambda e: dict(e))
                return converter(ds, lengths)

            def build(x):
                return tf.data.Dataset.from_tensor_slices(x).flat_map(one_row)

        @tf.function(autograph=False, input_signature=[spec])
        def run(x):
            n = tf.shape(next(iter(x.values())), out_type=tf.int64)[0]
            return build(x).batch(n).with_options(pipeline_options()).get_single_element()

        self._run = run

    def _pack(self, rows: Rows) -> dict[str, np.ndarray]:
        out: dict[str, list] = {}
        n_rows = len(rows[self.keys[0]])
        for r in range(n_rows):
            batch = {}
            for k in self.keys:
                exs = rows[k][r]
                arr = np.zeros((len(exs), max([len(e) for e in exs] + [1])), np.int32)
                for i, e in enumerate(exs):
                    arr[i, : len(e)] = e
                batch[k] = arr
            packed = packing.pack_group(batch, self.lengths)
            if packed[self.keys[0]].shape[0] != 1:
                raise DataTasksError(f"planned row {r} packed into {packed[self.keys[0]].shape[0]} rows, not 1")
            for k, v in packed.items():
                out.setdefault(k, []).append(v[0])
        return {k: np.stack(v) for k, v in out.items()}

    def __call__(self, rows: Rows) -> dict[str, np.ndarray]:
        if self.mode == "examples":
            x = {k: _ragged(rows[k], nested=False) for k in self.keys}
        elif self.mode == "prepacked":
            x = self._pack(rows)
        else:
            x = {k: _ragged(rows[k], nested=True) for k in self.keys}
        out = {k: v.numpy() for k, v in self._run(x).items()}
        if self.mode == "prepacked":
            out = {self.renames.get(k, k): v for k, v in out.items()}
        return out
