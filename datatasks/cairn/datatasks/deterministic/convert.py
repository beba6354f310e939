"""`ConvertStage`: planned rows of examples -> model features, with TensorFlow.

It takes the examples as the NumPy conversion does (`{feature: Ragged}` and the row sizes) and
builds its ragged tensors from their flat values and lengths (no Python lists between).

For converters without a NumPy conversion (`FeatureConverter.converts_numpy` is False: a
user's subclass, or passthrough features); the library's converters convert in NumPy
(`convert_numpy`). Two ways, both giving the converter's own output for each planned row:
* unpacked: the converter (pack=False) over the step's examples, one `tf.data` pass;
* packed: the converter alone on each row's examples (the plan guarantees one row).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cairn.datatasks.feature_converters import FeatureConverter
from cairn.datatasks.inline import map_inline, pipeline_options
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.ragged import Ragged


def _ragged(examples: Ragged, row_sizes: np.ndarray, nested: bool) -> tf.RaggedTensor:
    """The examples as a `[examples, None]` ragged tensor, or `[rows, None, None]` (`row_sizes`
    examples a row) when `nested`: built from the flat values and lengths as they are."""
    lengths = [np.asarray(examples.lengths, np.int64)]
    if nested:
        lengths.insert(0, np.asarray(row_sizes, np.int64))
    values = np.asarray(examples.values).astype(np.int32, copy=False)
    return tf.RaggedTensor.from_nested_row_lengths(values, lengths, validate=False)


class ConvertStage:
    """Converts this host's planned rows; `__call__` returns `{model feature: [rows, L]}`."""

    def __init__(
        self,
        converter: FeatureConverter,
        sequence_length: Mapping[str, int],
        keys: Sequence[str],
    ):
        self.keys = list(keys)
        lengths = dict(sequence_length)
        self.mode = "per_row" if converter.pack else "examples"
        ragged = tf.RaggedTensorSpec([None, None], tf.int32, ragged_rank=1)
        nested = tf.RaggedTensorSpec([None, None, None], tf.int32, ragged_rank=2)

        if self.mode == "examples":
            spec = {k: ragged for k in self.keys}

            def build(x):
                ds = map_inline(tf.data.Dataset.from_tensor_slices(x), lambda e: dict(e))
                return converter(ds, lengths)
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

    def __call__(self, examples: Mapping[str, Ragged], row_sizes: np.ndarray) -> dict[str, np.ndarray]:
        """The model features of rows of examples: row `r` holds the next `row_sizes[r]`
        examples of `examples` (`{task feature: Ragged}`, as `FeatureConverter.convert_numpy`
        takes them; one a row unpacked)."""
        x = {k: _ragged(examples[k], row_sizes, nested=self.mode == "per_row") for k in self.keys}
        return {k: v.numpy() for k, v in self._run(x).items()}
