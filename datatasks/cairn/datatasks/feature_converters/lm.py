"""Decoder-only converters: `LMFeatureConverter` and `PrefixLMFeatureConverter` (seqio's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cairn.datatasks.feature_converters.base import FeatureConverter, non_padding, non_padding_numpy
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.packing import autoregressive_inputs, make_autoregressive_inputs
from cairn.datatasks.ragged import Ragged, concat
from cairn.datatasks.tf_data import map_inline


class LMFeatureConverter(FeatureConverter):
    """targets -> `decoder_target_tokens`, `decoder_input_tokens`, `decoder_loss_weights`
    (+ `decoder_segment_ids`, `decoder_positions` when packed)."""

    TASK_FEATURES: Sequence[str] = ("targets",)
    MODEL_FEATURES: Sequence[str] = ("decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights")
    PACKING_FEATURES = ("decoder_segment_ids", "decoder_positions")

    def _lm_features(self, x):
        targets = x["targets"]
        d = {
            "decoder_target_tokens": targets,
            "decoder_input_tokens": make_autoregressive_inputs(targets, x.get("targets_segment_ids"), self._bos_id),
            "decoder_loss_weights": non_padding(targets),
        }
        if self._pack:
            d["decoder_segment_ids"] = x["targets_segment_ids"]
            d["decoder_positions"] = x["targets_positions"]
        return d

    def _convert_features(self, ds, lengths):
        ds = self._pack_or_pad(ds, lengths)
        passthrough = self._passthrough

        def convert(x):
            d = self._lm_features(x)
            d.update({k: x[k] for k in passthrough if k in x})
            return d

        return map_inline(ds, convert)

    def _lm_features_numpy(self, x: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        targets = x["targets"]
        d = {
            "decoder_target_tokens": targets,
            "decoder_input_tokens": autoregressive_inputs(targets, x.get("targets_segment_ids"), self._bos_id),
            "decoder_loss_weights": non_padding_numpy(targets),
        }
        if self._pack:
            d["decoder_segment_ids"] = x["targets_segment_ids"]
            d["decoder_positions"] = x["targets_positions"]
        return d

    def _convert_numpy(self, features, row_sizes, lengths):
        return self._lm_features_numpy(self._pack_or_pad_numpy(features, row_sizes, lengths))

    def packing_units(self, lengths, sequence_length):
        return self._units_of(lengths, "targets", sequence_length)[:, None], np.array([sequence_length["targets"]])

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        n = task_feature_lengths["targets"]
        keys = list(self.MODEL_FEATURES) + (list(self.PACKING_FEATURES) if self._pack else [])
        return {**dict.fromkeys(keys, n), **self._passthrough_lengths(task_feature_lengths)}


class PrefixLMFeatureConverter(LMFeatureConverter):
    """inputs + targets concatenated into one decoder sequence.

    Adds `decoder_causal_attention` (1 on the inputs and one position more); with
    `loss_on_targets_only` (default) the loss weights are 1 on the targets only.
    The decoder length is `inputs + targets` lengths.
    """

    TASK_FEATURES: Sequence[str] = ("inputs", "targets")
    MODEL_FEATURES: Sequence[str] = (
        "decoder_target_tokens",
        "decoder_input_tokens",
        "decoder_loss_weights",
        "decoder_causal_attention",
    )

    def __init__(self, loss_on_targets_only: bool = True, **kwargs):
        super().__init__(**kwargs)
        self._loss_on_targets_only = loss_on_targets_only

    @property
    def loss_on_targets_only(self) -> bool:
        return self._loss_on_targets_only

    def _concat_and_add_masks(self, x):
        """inputs + targets as one `targets`, with the inputs' width tiled along it."""
        inputs, targets = x["inputs"], x["targets"]
        # An empty target becomes one 0 (seqio's).
        targets = tf.concat([targets, tf.zeros([tf.maximum(1 - tf.size(targets), 0)], tf.int32)], 0)
        d = self._widths(inputs, tf.size(inputs) + tf.size(targets))
        d["targets"] = tf.concat([inputs, targets], axis=0)
        d.update({k: x[k] for k in self._passthrough})
        return d

    @staticmethod
    def _widths(inputs, size):
        width = tf.size(inputs)
        return {
            # 0 widths become -1 so that packing does not cut them as padding.
            "inputs_width": tf.fill([size], tf.where(width == 0, -1, width)),
            "inputs_width_add_pos": tf.fill([size], width + 1),
        }

    def _concat_lengths(self, lengths: Mapping[str, int]) -> dict[str, int]:
        total = sum(lengths[k] for k in self.TASK_FEATURES)
        out = dict.fromkeys(("targets", "inputs_width", "inputs_width_add_pos"), total)
        out.update(self._passthrough_lengths(lengths))
        return out

    def _convert_example(self, x):
        x = dict(x)
        x["inputs_width"] = tf.where(x["inputs_width"] == -1, 0, x["inputs_width"])
        d = self._lm_features(x)
        positions = x["targets_positions"] if self._pack else tf.range(tf.size(x["targets"]))
        d["decoder_causal_attention"] = tf.cast(positions < x["inputs_width_add_pos"], tf.int32)
        if self._loss_on_targets_only:
            is_input = positions < x["inputs_width"]
            d["decoder_loss_weights"] = tf.cast(
                tf.math.logical_xor(is_input, tf.cast(d["decoder_loss_weights"], tf.bool)), tf.int32
            )
        d.update({k: x[k] for k in self._passthrough if k in x})
        return d

    def _convert_features(self, ds, lengths):
        ds = map_inline(ds, self._concat_and_add_masks)
        ds = self._pack_or_pad(ds, self._concat_lengths(lengths))
        return map_inline(ds, self._convert_example)

    def _convert_numpy(self, features, row_sizes, lengths):
        total = lengths["inputs"] + lengths["targets"]
        inputs, targets = features["inputs"], features["targets"]
        empty = targets.lengths == 0
        if empty.any():  # an empty target becomes one 0 (as the TensorFlow path)
            targets = Ragged(
                np.insert(targets.values, targets.offsets[:-1][empty], 0).astype(np.int32), targets.lengths + empty
            )
        width = inputs.lengths
        size = width + targets.lengths
        both = concat([inputs, targets])
        n = len(inputs)
        x = {
            "targets": both.take(np.stack([np.arange(n), np.arange(n) + n], 1).reshape(-1)),
            # 0 widths become -1 so that packing does not cut them as padding.
            "inputs_width": Ragged(np.repeat(np.where(width == 0, -1, width), size).astype(np.int32), size),
            "inputs_width_add_pos": Ragged(np.repeat(width + 1, size).astype(np.int32), size),
        }
        x["targets"] = Ragged(x["targets"].values, size)
        x = self._pack_or_pad_numpy(x, row_sizes, dict.fromkeys(x, total))
        x["inputs_width"] = np.where(x["inputs_width"] == -1, 0, x["inputs_width"])
        d = self._lm_features_numpy(x)
        positions = x["targets_positions"] if self._pack else np.arange(total, dtype=np.int32)[None, :]
        d["decoder_causal_attention"] = (positions < x["inputs_width_add_pos"]).astype(np.int32)
        if self._loss_on_targets_only:
            is_input = positions < x["inputs_width"]
            d["decoder_loss_weights"] = (is_input ^ (d["decoder_loss_weights"] != 0)).astype(np.int32)
        return d

    def packing_units(self, lengths, sequence_length):
        total = sequence_length["inputs"] + sequence_length["targets"]
        units = self._units_of(lengths, "inputs", sequence_length) + np.maximum(
            self._units_of(lengths, "targets", sequence_length), 1
        )
        return units[:, None], np.array([total])

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        n = sum(task_feature_lengths[k] for k in self.TASK_FEATURES)
        keys = list(self.MODEL_FEATURES) + (list(self.PACKING_FEATURES) if self._pack else [])
        return {**dict.fromkeys(keys, n), **self._passthrough_lengths(task_feature_lengths)}
