"""`EncDecFeatureConverter`: (inputs, targets) -> encoder/decoder model features (seqio's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cairn.datatasks.feature_converters.base import FeatureConverter, non_padding, non_padding_numpy
from cairn.datatasks.packing import autoregressive_inputs, make_autoregressive_inputs
from cairn.datatasks.tf_data import map_inline, no_autograph


class EncDecFeatureConverter(FeatureConverter):
    """Outputs `encoder_input_tokens`, `decoder_target_tokens`, `decoder_input_tokens`,
    `decoder_loss_weights`, and when packed `encoder_/decoder_segment_ids` and
    `encoder_/decoder_positions`."""

    TASK_FEATURES: Sequence[str] = ("inputs", "targets")
    MODEL_FEATURES: Sequence[str] = (
        "encoder_input_tokens",
        "decoder_target_tokens",
        "decoder_input_tokens",
        "decoder_loss_weights",
    )
    PACKING_FEATURES: Sequence[str] = (
        "encoder_segment_ids",
        "decoder_segment_ids",
        "encoder_positions",
        "decoder_positions",
    )

    def _convert_features(self, ds, lengths):
        ds = self._pack_or_pad(ds, lengths)
        pack, bos, passthrough = self._pack, self._bos_id, self._passthrough

        @no_autograph
        def convert(x):
            targets = x["targets"]
            d = {
                "encoder_input_tokens": x["inputs"],
                "decoder_target_tokens": targets,
                "decoder_input_tokens": make_autoregressive_inputs(targets, x.get("targets_segment_ids"), bos),
                "decoder_loss_weights": non_padding(targets),
            }
            if pack:
                d["encoder_segment_ids"] = x["inputs_segment_ids"]
                d["decoder_segment_ids"] = x["targets_segment_ids"]
                d["encoder_positions"] = x["inputs_positions"]
                d["decoder_positions"] = x["targets_positions"]
            d.update({k: x[k] for k in passthrough if k in x})
            return d

        return map_inline(ds, convert)

    def _convert_numpy(self, features, row_sizes, lengths):
        x = self._pack_or_pad_numpy(features, row_sizes, lengths)
        targets = x["targets"]
        d = {
            "encoder_input_tokens": x["inputs"],
            "decoder_target_tokens": targets,
            "decoder_input_tokens": autoregressive_inputs(targets, x.get("targets_segment_ids"), self._bos_id),
            "decoder_loss_weights": non_padding_numpy(targets),
        }
        if self._pack:
            d["encoder_segment_ids"] = x["inputs_segment_ids"]
            d["decoder_segment_ids"] = x["targets_segment_ids"]
            d["encoder_positions"] = x["inputs_positions"]
            d["decoder_positions"] = x["targets_positions"]
        return d

    def packing_units(self, lengths, sequence_length):
        units = np.stack([self._units_of(lengths, k, sequence_length) for k in ("inputs", "targets")], 1)
        return units, np.array([sequence_length["inputs"], sequence_length["targets"]])

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        enc, dec = task_feature_lengths["inputs"], task_feature_lengths["targets"]
        out = {
            "encoder_input_tokens": enc,
            "decoder_target_tokens": dec,
            "decoder_input_tokens": dec,
            "decoder_loss_weights": dec,
        }
        if self._pack:
            out.update(encoder_segment_ids=enc, encoder_positions=enc, decoder_segment_ids=dec, decoder_positions=dec)
        return {**out, **self._passthrough_lengths(task_feature_lengths)}
