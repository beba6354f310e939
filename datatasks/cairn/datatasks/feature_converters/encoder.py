"""`EncoderFeatureConverter`: aligned (inputs, targets) -> encoder-only (BERT-style) model features (seqio's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cairn.datatasks.feature_converters.base import FeatureConverter
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.tf_data import map_inline


class EncoderFeatureConverter(FeatureConverter):
    """Outputs `encoder_input_tokens` (inputs), `encoder_target_tokens` (targets) and
    `encoder_loss_weights` (1 where the inputs hold `mask_id`), and when packed
    `encoder_segment_ids` and `encoder_positions` (those of the inputs). A classification
    sentinel (e.g. `[CLS]`) is expected at the start of each example's inputs and targets;
    it stays with its example when packed. Lengths: the inputs' for every feature."""

    TASK_FEATURES: Sequence[str] = ("inputs", "targets")
    MODEL_FEATURES: Sequence[str] = ("encoder_target_tokens", "encoder_input_tokens", "encoder_loss_weights")
    PACKING_FEATURES = ("encoder_segment_ids", "encoder_positions")

    def __init__(self, mask_id: int, **kwargs):
        super().__init__(**kwargs)
        self._mask_id = int(mask_id)

    @property
    def mask_id(self) -> int:
        """The mask sentinel id: the loss is taken where the inputs hold it."""
        return self._mask_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mask_id={self._mask_id}, pack={self._pack})"

    def _convert_features(self, ds, lengths):
        ds = self._pack_or_pad(ds, lengths)
        pack, mask_id, passthrough = self._pack, self._mask_id, self._passthrough

        def convert(x):
            inputs = x["inputs"]
            d = {
                "encoder_input_tokens": inputs,
                "encoder_target_tokens": x["targets"],
                "encoder_loss_weights": tf.cast(tf.equal(inputs, mask_id), tf.int32),
            }
            if pack:
                d["encoder_segment_ids"] = x["inputs_segment_ids"]
                d["encoder_positions"] = x["inputs_positions"]
            d.update({k: x[k] for k in passthrough if k in x})
            return d

        return map_inline(ds, convert)

    def _convert_numpy(self, features, row_sizes, lengths):
        x = self._pack_or_pad_numpy(features, row_sizes, lengths)
        inputs = x["inputs"]
        d = {
            "encoder_input_tokens": inputs,
            "encoder_target_tokens": x["targets"],
            "encoder_loss_weights": (inputs == self._mask_id).astype(np.int32),
        }
        if self._pack:
            d["encoder_segment_ids"] = x["inputs_segment_ids"]
            d["encoder_positions"] = x["inputs_positions"]
        return d

    def packing_units(self, lengths, sequence_length):
        units = np.stack([self._units_of(lengths, k, sequence_length) for k in ("inputs", "targets")], 1)
        return units, np.array([sequence_length["inputs"], sequence_length["targets"]])

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        keys = list(self.MODEL_FEATURES) + (list(self.PACKING_FEATURES) if self._pack else [])
        return {
            **dict.fromkeys(keys, task_feature_lengths["inputs"]),
            **self._passthrough_lengths(task_feature_lengths),
        }
