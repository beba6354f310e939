"""Converters for data that is already model-shaped (seqio's): `PassThroughFeatureConverter`,
`PrePackedEncDecFeatureConverter`, `PrePackedLMFeatureConverter`, `PrePackedPrefixLMFeatureConverter`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cairn.datatasks import packing
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.feature_converters.base import FeatureConverter, non_padding, non_padding_numpy
from cairn.datatasks.feature_converters.encdec import EncDecFeatureConverter
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.packing import autoregressive_inputs, make_autoregressive_inputs
from cairn.datatasks.tf_data import map_inline

_PACKED = ("inputs_positions", "inputs_segment_ids", "targets_positions", "targets_segment_ids")


class PrePackedEncDecFeatureConverter(EncDecFeatureConverter):
    """EncDec model features from examples packed beforehand: the task gives `inputs`,
    `targets` and their `*_segment_ids` and `*_positions`, which are padded (never packed
    again: `pack=False` is required) and renamed; `decoder_input_tokens` restart at every
    target segment."""

    TASK_FEATURES: Sequence[str] = ("inputs", "targets", *_PACKED)
    MODEL_FEATURES: Sequence[str] = (*EncDecFeatureConverter.MODEL_FEATURES, *EncDecFeatureConverter.PACKING_FEATURES)
    PACKING_FEATURES: Sequence[str] = ()

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if self._pack:
            raise DataTasksError("PrePackedEncDecFeatureConverter takes packed examples: pass pack=False")

    @staticmethod
    def _features(x, autoregressive, loss_weights, bos_id):
        return {
            "encoder_input_tokens": x["inputs"],
            "decoder_target_tokens": x["targets"],
            "decoder_input_tokens": autoregressive(x["targets"], x["targets_segment_ids"], bos_id),
            "decoder_loss_weights": loss_weights(x["targets"]),
            "encoder_segment_ids": x["inputs_segment_ids"],
            "decoder_segment_ids": x["targets_segment_ids"],
            "encoder_positions": x["inputs_positions"],
            "decoder_positions": x["targets_positions"],
        }

    def _convert_features(self, ds, lengths):
        ds = packing.trim_and_pad_dataset(ds, lengths)
        bos, passthrough = self._bos_id, self._passthrough

        def convert(x):
            d = self._features(x, make_autoregressive_inputs, non_padding, bos)
            d.update({k: x[k] for k in passthrough if k in x})
            return d

        return map_inline(ds, convert)

    def _convert_numpy(self, features, row_sizes, lengths):
        x = {k: features[k].padded(n) for k, n in lengths.items()}
        return self._features(x, autoregressive_inputs, non_padding_numpy, self._bos_id)

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        enc, dec = task_feature_lengths["inputs"], task_feature_lengths["targets"]
        out = {k: (enc if k.startswith("encoder") else dec) for k in self.MODEL_FEATURES}
        return {**out, **self._passthrough_lengths(task_feature_lengths)}


class PassThroughFeatureConverter(FeatureConverter):
    """Returns the dataset as it is (seqio's). With `apply_length_check=True` an example
    with a feature longer than its `task_feature_lengths` entry is an error. Model feature
    lengths: the task feature lengths (seqio returns None)."""

    def __init__(
        self,
        pack: bool = False,
        bos_id: int = 0,
        passthrough_features: Sequence[str] = (),
        *,
        apply_length_check: bool = False,
    ):
        super().__init__(pack, bos_id, passthrough_features, apply_length_check=apply_length_check)

    def __call__(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        if self._apply_length_check:
            return self._check_lengths(ds, task_feature_lengths)
        return ds

    def _convert_features(self, ds, lengths):
        return ds

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        return dict(task_feature_lengths)


class PrePackedLMFeatureConverter(PassThroughFeatureConverter):
    """Keeps `BATCH_FEATURES` (decoder features packed beforehand; plus any passthrough
    features) and fixes their length to `task_feature_lengths["targets"]`: trimmed and
    padded, or with `apply_length_check=True` an error unless exactly that long (seqio
    sets the static shape without a check)."""

    BATCH_FEATURES: Sequence[str] = (
        "decoder_input_tokens",
        "decoder_loss_weights",
        "decoder_positions",
        "decoder_segment_ids",
        "decoder_target_tokens",
    )
    LENGTH_KEYS: Sequence[str] = ("targets",)

    def decoder_length(self, task_feature_lengths: Mapping[str, int]) -> int:
        """The length of every batch feature: the sum of the `LENGTH_KEYS` lengths."""
        missing = [k for k in self.LENGTH_KEYS if k not in task_feature_lengths]
        if missing:
            raise DataTasksError(f"{type(self).__name__}: task_feature_lengths is missing {missing}")
        return sum(task_feature_lengths[k] for k in self.LENGTH_KEYS)

    def __call__(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        name, n = type(self).__name__, self.decoder_length(task_feature_lengths)
        keep = [*self.BATCH_FEATURES, *self._passthrough]
        missing = [k for k in keep if k not in ds.element_spec]
        if missing:
            raise DataTasksError(f"{name}: the dataset has no feature {missing[0]!r}; it has {sorted(ds.element_spec)}")
        ds = map_inline(ds, lambda x: {k: x[k] for k in keep})
        lengths = {k: n for k in self.BATCH_FEATURES} | self._passthrough_lengths(task_feature_lengths)
        if self._apply_length_check:
            ds = self._check_lengths(ds, lengths, exact=True)
        return packing.trim_and_pad_dataset(ds, lengths)

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        n = self.decoder_length(task_feature_lengths)
        return dict.fromkeys(self.BATCH_FEATURES, n) | self._passthrough_lengths(task_feature_lengths)


class PrePackedPrefixLMFeatureConverter(PrePackedLMFeatureConverter):
    """`PrePackedLMFeatureConverter` with `decoder_causal_attention` too, every feature of
    length `inputs + targets`."""

    BATCH_FEATURES: Sequence[str] = (*PrePackedLMFeatureConverter.BATCH_FEATURES, "decoder_causal_attention")
    LENGTH_KEYS: Sequence[str] = ("inputs", "targets")
