"""`TableDataSource`: Parquet, Arrow (Hugging Face `datasets` folders), CSV and TSV files.

Each example is one row: `{feature: value}` of the columns asked for (`columns`: a list, the
columns keep their names, or `{feature: column}`), text as a scalar string, integers and
booleans as int64, floats as float32. The files of a split are read in sorted order, each a
batch at a time (`table_files`: a Parquet row group, an Arrow record batch, a CSV block; only
the wanted columns), locally or at a URL through `cairn.storage`: record `i` is the same on every
run and host. A split may be a slice (`splits={"train": "train[:90%]", "validation":
"train[90%:]"}`; `split_slicing`), from the files' row counts (Parquet's footers; Arrow and CSV
files are read once to count them).

The cache fingerprint holds every file's name, size and SHA-256 (`FileDataSource`), plus the
format and the columns read (`read_options`). `check(split)` reads every file's schema (no row):
a missing column, an empty or truncated file, a file of another schema is one line naming the
file, before anything is cached.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from cairn import storage
from cairn.datatasks import split_slicing, table_files, url_sources
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.sources import FileDataSource, ShardInfo, SourceFile, list_files
from cairn.datatasks.stats import DataStats
from cairn.datatasks.tf_data import no_autograph

_DTYPES = {"text": "string", "int": "int64", "float": "float32"}


def _hf_state(folder: str) -> tuple[str, list[str]]:
    """`(split, Arrow files)` of one `datasets` `Dataset` folder, from its `state.json`."""
    state_path = storage.join(folder, "state.json")
    if not url_sources.exists(state_path):
        raise DataTasksError(f"{folder} is not a Hugging Face datasets folder (no state.json or dataset_dict.json)")
    state = json.loads(storage.read_text(state_path))
    names = [f["filename"] for f in state.get("_data_files", [])]
    if not names:
        raise DataTasksError(f"{state_path} lists no data file")
    return state.get("_split") or "train", [storage.join(folder, n) for n in names]


def hf_split_files(path: str) -> dict[str, list[str]]:
    """`{split: Arrow files}` of a Hugging Face `datasets` folder written by `save_to_disk`: a
    `DatasetDict` (`dataset_dict.json` naming the splits, one folder each) or one `Dataset`
    (its `state.json`'s split, else `train`). Each folder's `state.json` lists its files."""
    path = path.rstrip("/")
    listing = storage.join(path, "dataset_dict.json")
    if url_sources.exists(listing):
        splits = json.loads(storage.read_text(listing)).get("splits", [])
        return {s: _hf_state(storage.join(path, s))[1] for s in splits}
    split, files = _hf_state(path)
    return {split: files}


class TableDataSource(FileDataSource):
    """Rows of table files as examples.

    Args:
      split_to_filepattern: `{split: pattern or patterns}` of the files.
      file_format: `parquet`, `arrow`, `csv` or `tsv` (`table_files.FORMATS`).
      columns: the columns to read (their names kept), or `{feature: column}`; None: all the
        columns of the split's first file.
      splits: `{split of this source: spec}` over the splits of `split_to_filepattern`, e.g.
        `{"train": "train[:90%]", "validation": "train[90%:]"}`; None: those splits as they are.
    """

    def __init__(
        self,
        split_to_filepattern: Mapping[str, str | Sequence[str]],
        file_format: str,
        columns: Sequence[str] | Mapping[str, str] | None = None,
        splits: Mapping[str, str] | None = None,
        num_input_examples: Mapping[str, int] | None = None,
    ):
        self._format = table_files.check_format(file_format)
        patterns = {k: ([v] if isinstance(v, str) else list(v)) for k, v in split_to_filepattern.items()}
        self._specs = dict(splits) if splits is not None else {s: s for s in patterns}
        for spec in self._specs.values():
            for part in split_slicing.parse(spec):  # a bad spec is named before any file is read
                if part.name not in patterns:
                    raise DataTasksError(f"split {spec!r}: no split {part.name!r} (known: {sorted(patterns)})")
        super().__init__({s: [] for s in self._specs}, num_input_examples)  # files: `source_files`
        self._file_patterns = patterns
        if columns is None or isinstance(columns, Mapping):
            self._columns = None if columns is None else dict(columns)
        else:
            self._columns = {c: c for c in columns}
        self._rows: dict[str, int] = {}
        self._wanted: list[table_files.Column] = []

    @classmethod
    def from_hf_folder(
        cls,
        path: str,
        columns: Sequence[str] | Mapping[str, str] | None = None,
        splits: Mapping[str, str] | None = None,
    ) -> TableDataSource:
        """A Hugging Face `datasets` folder (`save_to_disk`), locally or at a URL (`hf_split_files`)."""
        return cls(hf_split_files(path), "arrow", columns, splits)

    @classmethod
    def from_hub(
        cls,
        name: str,
        config: str | None = None,
        columns: Sequence[str] | Mapping[str, str] | None = None,
        splits: Mapping[str, str] | None = None,
        **load_kwargs: Any,
    ) -> TableDataSource:
        """`datasets.load_dataset(name, config, **load_kwargs)` (an optional dependency: it may
        download), read from the Arrow cache files it leaves."""
        try:  # not a declared dependency: found at run time only
            datasets = importlib.import_module("datasets")
        except ImportError:
            raise DataTasksError(
                f"TableDataSource.from_hub({name!r}) needs the `datasets` package (pip install datasets); "
                f"or save the dataset with save_to_disk and use from_hf_folder"
            ) from None
        loaded = datasets.load_dataset(name, config, **load_kwargs)
        files = {s: [c["filename"] for c in d.cache_files] for s, d in loaded.items()}
        return cls(files, "arrow", columns, splits)

    @property
    def file_format(self) -> str:
        return self._format

    @property
    def read_options(self) -> dict[str, Any]:
        """What shapes the examples besides the files' bytes (joins the cache fingerprint)."""
        return {"format": self._format, "columns": self._columns, "splits": self._specs}

    def _row_count(self, path: str) -> int:
        if path not in self._rows:
            self._rows[path] = table_files.num_rows(path, self._format)
        return self._rows[path]

    def source_files(self, split: str) -> list[SourceFile]:
        """The files of `split`; for a sliced spec, only the files it touches, each with its
        window of rows (none when the whole file is selected)."""
        self._check_split(split)
        spec = self._specs[split]
        if not split_slicing.is_sliced(spec):
            return list_files(spec, self._file_patterns[spec])
        listed = {p.name: list_files(p.name, self._file_patterns[p.name]) for p in split_slicing.parse(spec)}
        lengths = {name: [self._row_count(f.path) for f in files] for name, files in listed.items()}
        out = []
        for w in split_slicing.resolve(spec, lengths):
            f = listed[w.split][w.file]
            whole = w.skip == 0 and w.take == lengths[w.split][w.file]
            out.append(SourceFile(w.part, f.path, f.name, 0 if whole else w.skip, None if whole else w.take))
        return out

    def num_input_examples(self, split: str) -> int | None:
        known = super().num_input_examples(split)
        if known is not None or not split_slicing.is_sliced(self._specs[split]):
            return known
        return sum(f.take if f.take is not None else self._row_count(f.path) - f.skip for f in self.source_files(split))

    def columns(self, split: str) -> dict[str, table_files.Column]:
        """`{feature: Column}` read from `split`'s first file (its schema only)."""
        files = self.source_files(split)
        wanted = None if self._columns is None else list(self._columns.values())
        cols = table_files.select(files[0].path, self._format, wanted)
        names = list(self._columns) if self._columns is not None else [c.name for c in cols]
        return dict(zip(names, cols))

    def check(self, split: str) -> None:
        """Reads the schema of every file of `split` (no row): a file that is empty, truncated,
        lacks a column or has another type for one is a `CorruptSourceError` naming it."""
        files = self.source_files(split)
        first = list(self.columns(split).values())
        for f in files[1:]:
            cols = table_files.select(f.path, self._format, [c.name for c in first])
            for got, want in zip(cols, first):
                if got.kind != want.kind:
                    raise url_sources.CorruptSourceError(
                        f"table file {f.path}: column {want.name!r} is {got.arrow}, the split's first file "
                        f"{files[0].path} has {want.arrow} (a different schema)"
                    )

    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
        stats: DataStats | None = None,
    ) -> tf.data.Dataset:
        self._features = self.columns(split)
        return super().get_dataset(split, shuffle, seed, shard_info, stats)

    @no_autograph
    def _read_file(self, path, skip=0):
        features, fmt = self._features, self._format
        signature = {k: tf.TensorSpec([None], tf.dtypes.as_dtype(_DTYPES[c.kind])) for k, c in features.items()}
        rows = functools.partial(_feature_batches, file_format=fmt, features=features)
        return tf.data.Dataset.from_generator(rows, output_signature=signature, args=(path, skip)).unbatch()

    @no_autograph
    def _read_window(self, read_file, path, skip, take):
        """The window's rows only: Parquet row groups before it are not read."""
        return self._read_file(path, skip).take(take)


def _feature_batches(
    path: bytes, skip: int, file_format: str, features: Mapping[str, table_files.Column]
) -> Iterator[dict[str, Any]]:
    """`{feature: values}` of the file at `path` from row `skip` on, a batch at a time (what
    tf.data unbatches)."""
    wanted = list(features.values())
    for batch in url_sources.reporting(table_files.batches(path.decode(), file_format, wanted, int(skip))):
        yield {k: batch[c.name] for k, c in features.items()}
