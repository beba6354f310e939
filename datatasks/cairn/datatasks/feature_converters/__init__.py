"""Feature converters: task features -> model features, packed or padded."""

from cairn.datatasks.feature_converters.base import FeatureConverter
from cairn.datatasks.feature_converters.decoder import DecoderFeatureConverter, PrefixSuffixLMFeatureConverter
from cairn.datatasks.feature_converters.encdec import EncDecFeatureConverter
from cairn.datatasks.feature_converters.encoder import EncoderFeatureConverter
from cairn.datatasks.feature_converters.lm import LMFeatureConverter, PrefixLMFeatureConverter
from cairn.datatasks.feature_converters.prepacked import (
    PassThroughFeatureConverter,
    PrePackedEncDecFeatureConverter,
    PrePackedLMFeatureConverter,
    PrePackedPrefixLMFeatureConverter,
)

__all__ = [
    "DecoderFeatureConverter",
    "EncDecFeatureConverter",
    "EncoderFeatureConverter",
    "FeatureConverter",
    "LMFeatureConverter",
    "PassThroughFeatureConverter",
    "PrePackedEncDecFeatureConverter",
    "PrePackedLMFeatureConverter",
    "PrePackedPrefixLMFeatureConverter",
    "PrefixLMFeatureConverter",
    "PrefixSuffixLMFeatureConverter",
]
