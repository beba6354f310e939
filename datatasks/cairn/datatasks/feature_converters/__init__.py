"""Feature converters: task features -> model features, packed or padded."""

from cairn.datatasks.feature_converters.base import FeatureConverter
from cairn.datatasks.feature_converters.encdec import EncDecFeatureConverter
from cairn.datatasks.feature_converters.lm import LMFeatureConverter, PrefixLMFeatureConverter

__all__ = ["EncDecFeatureConverter", "FeatureConverter", "LMFeatureConverter", "PrefixLMFeatureConverter"]
