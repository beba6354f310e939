"""`PrefixSuffixLMFeatureConverter` and `DecoderFeatureConverter` (seqio's).

Where Cairn differs from seqio 0.0.20 on purpose: `loss_on_targets_only=False` is honoured
(seqio's `PrefixSuffixLMFeatureConverter.__init__` hands its parent the default, so the
flag is always True there, also through `DecoderFeatureConverter` when suffixes are given).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.feature_converters.base import FeatureConverter
from cairn.datatasks.feature_converters.lm import LMFeatureConverter, PrefixLMFeatureConverter
from cairn.datatasks.lazy_tf import tf


class PrefixSuffixLMFeatureConverter(PrefixLMFeatureConverter):
    """inputs + targets + suffixes concatenated into one decoder sequence.

    As `PrefixLMFeatureConverter` with `targets + suffixes` as the targets, plus
    `target_suffix_weights`: 1 on the suffixes, or on the targets when the suffixes are
    empty. `loss_on_targets_only` (default True): loss weights on targets and suffixes
    only; False: on every token (seqio 0.0.20 ignores False). The decoder length is the
    sum of the three lengths.
    """

    TASK_FEATURES: Sequence[str] = ("inputs", "targets", "suffixes")
    MODEL_FEATURES: Sequence[str] = (*PrefixLMFeatureConverter.MODEL_FEATURES, "target_suffix_weights")

    def _concat_and_add_masks(self, x):
        inputs, targets, suffixes = x["inputs"], x["targets"], x["suffixes"]
        rest = tf.concat([targets, suffixes], 0)
        # Empty targets and suffixes become one 0 (seqio's).
        rest = tf.concat([rest, tf.zeros([tf.maximum(1 - tf.size(rest), 0)], tf.int32)], 0)
        size = tf.size(inputs) + tf.size(rest)
        # 1 on the inputs; on the rest 2 for the suffixes, or for everything when there are none.
        in_suffix = (tf.range(tf.size(rest)) >= tf.size(targets)) | (tf.size(suffixes) == 0)
        d = self._widths(inputs, size)
        d["targets"] = tf.concat([inputs, rest], 0)
        d["target_suffix_weights"] = tf.concat([tf.ones_like(inputs), tf.where(in_suffix, 2, 1)], 0)
        d.update({k: x[k] for k in self._passthrough})
        return d

    def _concat_lengths(self, lengths: Mapping[str, int]) -> dict[str, int]:
        out = super()._concat_lengths(lengths)
        out["target_suffix_weights"] = out["targets"]
        return out

    def _convert_example(self, x):
        d = super()._convert_example(x)
        d["target_suffix_weights"] = tf.cast(tf.equal(x["target_suffix_weights"], 2), tf.int32)
        return d

    def packing_units(self, lengths, sequence_length):
        total = sum(sequence_length[k] for k in self.TASK_FEATURES)
        rest = self._units_of(lengths, "targets", sequence_length) + self._units_of(
            lengths, "suffixes", sequence_length
        )
        units = self._units_of(lengths, "inputs", sequence_length) + np.maximum(rest, 1)
        return units[:, None], np.array([total])


class DecoderFeatureConverter(FeatureConverter):
    """LM, PrefixLM or PrefixSuffixLM conversion, chosen by the task feature lengths' keys:
    `suffixes` given: `PrefixSuffixLMFeatureConverter`; else `inputs` given:
    `PrefixLMFeatureConverter`; else `LMFeatureConverter`. The arguments go to all three
    (`loss_on_targets_only` to the two with inputs)."""

    TASK_FEATURES: Sequence[str] = ("targets",)
    MODEL_FEATURES: Sequence[str] = PrefixLMFeatureConverter.MODEL_FEATURES
    PACKING_FEATURES = LMFeatureConverter.PACKING_FEATURES

    def __init__(
        self,
        loss_on_targets_only: bool = True,
        pack: bool = True,
        bos_id: int = 0,
        passthrough_features: Sequence[str] = (),
        *,
        apply_length_check: bool = False,
    ):
        kwargs: dict[str, Any] = dict(
            pack=pack, bos_id=bos_id, passthrough_features=passthrough_features, apply_length_check=apply_length_check
        )
        super().__init__(**kwargs)
        self._loss_on_targets_only = loss_on_targets_only
        self.prefixsuffixlm_feature_converter = PrefixSuffixLMFeatureConverter(loss_on_targets_only, **kwargs)
        self.prefixlm_feature_converter = PrefixLMFeatureConverter(loss_on_targets_only, **kwargs)
        self.strictlm_feature_converter = LMFeatureConverter(**kwargs)

    @property
    def loss_on_targets_only(self) -> bool:
        return self._loss_on_targets_only

    def converter_for(self, task_feature_lengths: Mapping[str, int]) -> FeatureConverter:
        """The converter the lengths' keys choose (see the class docstring)."""
        if "suffixes" in task_feature_lengths:
            return self.prefixsuffixlm_feature_converter
        if "inputs" in task_feature_lengths:
            return self.prefixlm_feature_converter
        return self.strictlm_feature_converter

    def __call__(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        return self.converter_for(task_feature_lengths)(ds, task_feature_lengths)

    def _convert_features(self, ds, lengths):
        raise DataTasksError("DecoderFeatureConverter converts through the converter its lengths choose")

    def packing_units(self, lengths, sequence_length):
        return self.converter_for(sequence_length).packing_units(lengths, sequence_length)

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        return self.converter_for(task_feature_lengths).get_model_feature_lengths(task_feature_lengths)
