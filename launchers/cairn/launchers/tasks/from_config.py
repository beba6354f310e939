"""A task from a config alone: `data.source` names table files (`cairn.datatasks.TableDataSource`),
their columns as features and a shipped recipe; `register(keys, vocabulary)` registers it as
`data.task`. No Python module is written or imported.

Recipes (what runs on the rows; the cached part first, then what runs after the cache):

* `text_to_text`: `inputs` and `targets` columns -> tokens -> EOS after trimming (a question
  and its answer, a text and its summary).
* `lm`: a `targets` column -> tokens, concatenated and cut into 512-token chunks (cached) ->
  a seeded crop to the targets length (no EOS: a window of running text).
* `span_corruption`: a `targets` column -> the same chunks (cached) -> T5's span corruption
  (a seeded crop, noise density 0.15, mean span 3) and EOS.
* `prefix_lm`: a `targets` column -> the same chunks (cached) -> a seeded window of the inputs
  and targets lengths, its first part the inputs, the rest the targets, and EOS (T5's prefix LM
  objective with a fixed split point, `prefix_lm_one_to_one`; an encoder-decoder model).

Each task has the perplexity metric, so the final evaluation and `//launchers:eval` score it.
"""

from __future__ import annotations

import functools
from typing import Any

import cairn.datatasks as dt
from cairn.datatasks import preprocessors as pp
from cairn.evaluation import metrics

CHUNK_LENGTH = 512
# recipe -> the features its columns must name.
RECIPES: dict[str, tuple[str, ...]] = {
    "text_to_text": ("inputs", "targets"),
    "lm": ("targets",),
    "span_corruption": ("targets",),
    "prefix_lm": ("targets",),
}


def _chunks() -> list:
    return [
        pp.tokenize,
        functools.partial(pp.reduce_concat_tokens, feature_key="targets", batch_size=256),
        functools.partial(pp.split_tokens, max_tokens_per_segment=CHUNK_LENGTH, feature_key="targets"),
    ]


def recipe_task(name: str, source: dt.DataSource, recipe: str, vocabulary: Any) -> dt.Task:
    """The task `name` over `source` (its examples hold the recipe's features) for `recipe`."""
    if recipe == "text_to_text":
        features = {"inputs": dt.Feature(vocabulary), "targets": dt.Feature(vocabulary)}
        steps: list = [pp.tokenize, pp.append_eos_after_trim]
    elif recipe == "lm":
        features = {"targets": dt.Feature(vocabulary, add_eos=False)}
        steps = _chunks() + [pp.random_crop]
    elif recipe == "span_corruption":
        features = {"inputs": dt.Feature(vocabulary), "targets": dt.Feature(vocabulary)}
        steps = _chunks() + [pp.span_corruption_one_to_one, pp.append_eos_after_trim]
    elif recipe == "prefix_lm":
        features = {"inputs": dt.Feature(vocabulary), "targets": dt.Feature(vocabulary)}
        steps = _chunks() + [pp.prefix_lm_one_to_one, pp.append_eos_after_trim]
    else:
        raise dt.DataTasksError(f"unknown recipe {recipe!r}; expected one of {', '.join(RECIPES)}")
    return dt.Task(name, source, features, steps, metric_fns=[metrics.perplexity])


def make_source(source: Any) -> dt.TableDataSource:
    """The `TableDataSource` of a `data.source` section (`schema.Source`)."""
    columns = dict(source.columns)
    splits = dict(source.splits) or None
    if source.format == "hf":
        (folder,) = set(source.files.values())
        return dt.TableDataSource.from_hf_folder(folder, columns, splits)
    return dt.TableDataSource(dict(source.files), source.format, columns, splits)
