"""cairn.datatasks: tasks, mixtures, preprocessors, feature converters and packing (seqio's API).

import cairn.datatasks as dt
task = dt.TaskRegistry.add("my_task", dt.TextLineDataSource({"train": "data/*.txt"}), ...)
ds = dt.get_dataset("my_task", {"inputs": 512, "targets": 128},
                    dt.EncDecFeatureConverter(pack=True), seed=0, batch_size=32)
"""

__version__ = "0.1.0"

from cairn.datatasks import deterministic, preprocessors
from cairn.datatasks.dataset import get_dataset
from cairn.datatasks.errors import DataTasksError, UnknownNameError
from cairn.datatasks.feature import Feature
from cairn.datatasks.feature_converters import (
    DecoderFeatureConverter,
    EncDecFeatureConverter,
    EncoderFeatureConverter,
    FeatureConverter,
    LMFeatureConverter,
    PassThroughFeatureConverter,
    PrefixLMFeatureConverter,
    PrefixSuffixLMFeatureConverter,
    PrePackedEncDecFeatureConverter,
    PrePackedLMFeatureConverter,
    PrePackedPrefixLMFeatureConverter,
)
from cairn.datatasks.from_grain import GrainDataSource
from cairn.datatasks.json_source import JsonLinesDataSource
from cairn.datatasks.mixture import Mixture
from cairn.datatasks.preprocessors import map_over_dataset
from cairn.datatasks.proto_source import ProtoDataSource
from cairn.datatasks.registry import DEFAULT_REGISTRY, Registry, get_mixture_or_task
from cairn.datatasks.seqio_registries import MixtureRegistry, TaskRegistry
from cairn.datatasks.sources import (
    DataSource,
    FunctionDataSource,
    ShardInfo,
    TextLineDataSource,
    TFExampleDataSource,
)
from cairn.datatasks.stats import BadDataPolicy, DataStats
from cairn.datatasks.table_source import TableDataSource
from cairn.datatasks.task import Task
from cairn.datatasks.tf_data import map_inline, pipeline_options
from cairn.datatasks.tfds_source import TfdsDataSource
from cairn.datatasks.to_grain import DeterministicGrainSource, as_grain_dataset, as_grain_source

__all__ = [
    "BadDataPolicy",
    "DEFAULT_REGISTRY",
    "DataSource",
    "DataStats",
    "DataTasksError",
    "DecoderFeatureConverter",
    "DeterministicGrainSource",
    "EncDecFeatureConverter",
    "EncoderFeatureConverter",
    "Feature",
    "FeatureConverter",
    "FunctionDataSource",
    "GrainDataSource",
    "JsonLinesDataSource",
    "LMFeatureConverter",
    "Mixture",
    "ProtoDataSource",
    "MixtureRegistry",
    "PassThroughFeatureConverter",
    "PrePackedEncDecFeatureConverter",
    "PrePackedLMFeatureConverter",
    "PrePackedPrefixLMFeatureConverter",
    "PrefixLMFeatureConverter",
    "PrefixSuffixLMFeatureConverter",
    "Registry",
    "ShardInfo",
    "TFExampleDataSource",
    "TableDataSource",
    "Task",
    "TaskRegistry",
    "TextLineDataSource",
    "TfdsDataSource",
    "UnknownNameError",
    "as_grain_dataset",
    "as_grain_source",
    "deterministic",
    "get_dataset",
    "get_mixture_or_task",
    "map_inline",
    "map_over_dataset",
    "pipeline_options",
    "preprocessors",
]
