"""Tables in files, read with `pyarrow` a batch at a time: Parquet, Arrow IPC (what Hugging Face
`datasets` writes) and CSV / TSV. No TensorFlow here (`table_source` wraps these in tf.data), and
`pyarrow` is imported on first use, never with `cairn.datatasks`.

* Parquet: the footer gives the schema and the row count; rows are read one row group at a
  time, only the columns asked for.
* Arrow: IPC stream files (`datasets`' `save_to_disk` and cache files) or IPC files, a record
  batch at a time.
* CSV / TSV: a header line names the columns; every value is text. Parsed in one thread, block by
  block, so a bad row is named by its line.

Text is UTF-8: a text value that is not is an error, and so is a null (Parquet, Arrow; a CSV
has none: an empty field is empty text). Every error is a
`url_sources.CorruptSourceError`, one line naming the file and, where one applies, the row
group, the batch or the line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import IO, Any

import numpy as np

from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.url_sources import CorruptSourceError, open_binary

FORMATS = ("parquet", "arrow", "csv", "tsv")
CSV_BLOCK = 1 << 20  # bytes parsed per CSV block
_ARROW_FILE_MAGIC = b"ARROW1"


def _pa() -> Any:
    try:
        import pyarrow
    except ImportError:  # pragma: no cover - pyarrow is in the lock
        raise DataTasksError("reading Parquet, Arrow or CSV tables needs pyarrow (pip install pyarrow)") from None
    return pyarrow


def check_format(file_format: str) -> str:
    """`file_format` when it is one of `FORMATS`, else a `DataTasksError` listing them."""
    if file_format not in FORMATS:
        raise DataTasksError(f"unknown table format {file_format!r}; expected one of {', '.join(FORMATS)}")
    return file_format


@dataclasses.dataclass(frozen=True)
class Column:
    """A column as a source feature: `kind` is "text" (UTF-8, a string feature), "int" (int64) or
    "float" (float32); `arrow` is the file's own type (as text)."""

    name: str
    kind: str
    arrow: str


def _kind(name: str, arrow_type: Any, path: str) -> str:
    pa = _pa()
    t = arrow_type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "text"
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    raise CorruptSourceError(
        f"table file {path}: column {name!r} is {arrow_type}; a table source reads text, integer, boolean or "
        f"floating-point columns"
    )


def _open(path: str, what: str) -> IO[bytes]:
    f = open_binary(path)
    f.seek(0, 2)
    size = f.tell()
    f.seek(0)
    if size == 0:
        f.close()
        raise CorruptSourceError(f"{what} file {path} is empty (0 bytes)")
    return f


def _parquet(f: IO[bytes], path: str) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(f)
    except _pa().ArrowException as e:
        raise CorruptSourceError(
            f"Parquet file {path}: cannot read its footer (truncated or not Parquet): {e}"
        ) from None


def _arrow_reader(f: IO[bytes], path: str) -> Any:
    pa = _pa()
    import pyarrow.ipc  # noqa: F401 (pa.ipc)

    magic = f.read(len(_ARROW_FILE_MAGIC))
    f.seek(0)
    try:
        if magic == _ARROW_FILE_MAGIC:
            return pa.ipc.open_file(f)
        return pa.ipc.open_stream(f)
    except pa.ArrowException as e:
        raise CorruptSourceError(
            f"Arrow file {path}: cannot read its schema (truncated or not Arrow IPC): {e}"
        ) from None


def _csv_options(file_format: str, names: Sequence[str] | None, invalid: list) -> tuple:
    import pyarrow.csv as pcsv

    pa = _pa()

    def on_invalid(row: Any) -> str:
        invalid.append(row)
        return "skip"

    read = pcsv.ReadOptions(use_threads=False, block_size=CSV_BLOCK)
    parse = pcsv.ParseOptions(delimiter="\t" if file_format == "tsv" else ",", invalid_row_handler=on_invalid)
    convert = pcsv.ConvertOptions(
        column_types={n: pa.binary() for n in names or ()}, include_columns=list(names) if names else None
    )
    return read, parse, convert


def _csv_header(path: str, file_format: str) -> list[str]:
    import pyarrow.csv as pcsv

    with _open(path, file_format.upper()) as f:
        read, parse, _ = _csv_options(file_format, None, [])
        try:
            return list(pcsv.open_csv(f, read_options=read, parse_options=parse).schema.names)
        except _pa().ArrowException as e:
            raise CorruptSourceError(f"{file_format.upper()} file {path}: cannot read its header line: {e}") from None


def columns(path: str, file_format: str) -> list[Column]:
    """The columns of the table file at `path` (the footer, the schema message or the header
    line: no row is read)."""
    if file_format in ("csv", "tsv"):
        return [Column(n, "text", "string") for n in _csv_header(path, file_format)]
    with _open(path, "Parquet" if file_format == "parquet" else "Arrow") as f:
        if file_format == "parquet":
            schema = _parquet(f, path).schema_arrow
        else:
            schema = _arrow_reader(f, path).schema
    return [Column(field.name, _kind(field.name, field.type, path), str(field.type)) for field in schema]


def select(path: str, file_format: str, wanted: Sequence[str] | None) -> list[Column]:
    """The columns `wanted` (None: all) of the file at `path`, in that order; a column the file
    lacks is a `CorruptSourceError` naming the file, the column and the columns it has."""
    have = columns(path, file_format)
    if wanted is None:
        return have
    by_name = {c.name: c for c in have}
    missing = [w for w in wanted if w not in by_name]
    if missing:
        raise CorruptSourceError(
            f"table file {path} has no column {missing[0]!r}; its columns: {', '.join(c.name for c in have)}"
        )
    return [by_name[w] for w in wanted]


def num_rows(path: str, file_format: str) -> int:
    """The rows of the file: from the footer (Parquet) or by reading it (Arrow batches, CSV)."""
    if file_format == "parquet":
        with _open(path, "Parquet") as f:
            return int(_parquet(f, path).metadata.num_rows)
    first = columns(path, file_format)[:1]
    return sum(len(next(iter(b.values()))) for b in batches(path, file_format, first))


def _values(array: Any, column: Column, where: str, first: int) -> np.ndarray:
    """One column of a batch as NumPy: text as an object array of UTF-8 bytes. `first`: the
    index in the file of the batch's first row (errors name the row in the file)."""
    pa = _pa()
    if array.null_count:
        row = next(i for i, v in enumerate(array.is_valid().to_pylist()) if not v)
        raise CorruptSourceError(f"{where} row {first + row}: column {column.name!r} is null")
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if column.kind != "text":
        return array.to_numpy(zero_copy_only=False).astype(np.int64 if column.kind == "int" else np.float32)
    try:
        array.cast(pa.string()).validate(full=True)
    except pa.ArrowException:
        values = array.cast(pa.binary()).to_pylist()
        for i, v in enumerate(values):
            try:
                v.decode("utf-8")
            except UnicodeDecodeError as e:
                raise CorruptSourceError(
                    f"{where} row {first + i}: column {column.name!r} is not UTF-8 text ({e.reason} at byte {e.start})"
                ) from None
        raise
    out = np.empty(len(array), dtype=object)
    out[:] = array.cast(pa.binary()).to_pylist()
    return out


def _check_types(table_columns: Any, wanted: Sequence[Column], where: str, path: str) -> None:
    """A `CorruptSourceError` unless each column of a batch has its wanted kind."""
    for got, want in zip(table_columns, wanted):
        kind = _kind(want.name, got.type, path)
        if kind != want.kind:
            raise CorruptSourceError(
                f"{where}: column {want.name!r} is {got.type}, the split's first file has {want.arrow} "
                f"(a different schema)"
            )


def batches(path: str, file_format: str, wanted: Sequence[Column], skip: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """The rows of the file at `path` from row `skip` on, `{column: values}` a batch at a time (a
    Parquet row group, an Arrow record batch, a CSV block), only the `wanted` columns, each
    checked against its `Column` (a file or row group of another schema is an error naming it).
    Parquet row groups before `skip` are not read."""
    names = [c.name for c in wanted]
    select(path, file_format, names)  # a missing column, named with the file's columns
    tables = {"parquet": _parquet_tables, "arrow": _arrow_tables}.get(file_format, _csv_tables)
    for where, first, table in tables(path, file_format, names, skip):
        if first + table.num_rows <= skip:
            continue
        if first < skip:
            table, first = table.slice(skip - first), skip
        columns_ = [table.column(n).combine_chunks() for n in names]
        _check_types(columns_, wanted, where, path)
        yield {c.name: _values(a, c, where, first) for c, a in zip(wanted, columns_)}


# Each yields `(where, index of its first row in the file, pyarrow.Table)` per batch of the file.


def _parquet_tables(path: str, file_format: str, names: list[str], skip: int) -> Iterator[tuple[str, int, Any]]:
    pa = _pa()
    with _open(path, "Parquet") as f:
        pf = _parquet(f, path)
        first = 0
        for g in range(pf.metadata.num_row_groups):
            rows = pf.metadata.row_group(g).num_rows
            if first + rows > skip:  # a row group wholly before the window is not read
                where = f"Parquet file {path} row group {g}"
                try:
                    yield where, first, pf.read_row_group(g, columns=names)
                except pa.ArrowException as e:
                    raise CorruptSourceError(f"{where}: cannot be read: {e}") from None
            first += rows


def _arrow_tables(path: str, file_format: str, names: list[str], skip: int) -> Iterator[tuple[str, int, Any]]:
    pa = _pa()
    with _open(path, "Arrow") as f:
        reader = _arrow_reader(f, path)
        count = reader.num_record_batches if hasattr(reader, "num_record_batches") else None
        b = first = 0
        while count is None or b < count:
            where = f"Arrow file {path} record batch {b}"
            try:
                batch = reader.get_batch(b) if count is not None else reader.read_next_batch()
            except StopIteration:
                return
            except pa.ArrowException as e:
                raise CorruptSourceError(f"{where}: cannot be read (truncated?): {e}") from None
            yield where, first, pa.Table.from_batches([batch]).select(names)
            b, first = b + 1, first + batch.num_rows


def _csv_tables(path: str, file_format: str, names: list[str], skip: int) -> Iterator[tuple[str, int, Any]]:
    import pyarrow.csv as pcsv

    pa = _pa()
    what = file_format.upper()
    invalid: list = []
    first = 0
    read, parse, convert = _csv_options(file_format, names, invalid)
    with _open(path, what) as f:
        try:
            reader = pcsv.open_csv(f, read_options=read, parse_options=parse, convert_options=convert)
        except pa.ArrowException as e:
            raise CorruptSourceError(f"{what} file {path}: cannot be parsed: {e}") from None
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                batch = None
            except pa.ArrowException as e:
                raise CorruptSourceError(f"{what} file {path}: cannot be parsed: {e}") from None
            if invalid:
                row = invalid[0]
                raise CorruptSourceError(
                    f"{what} file {path} line {row.number}: {row.actual_columns} fields, the header has "
                    f"{row.expected_columns}"
                )
            if batch is None:
                return
            yield f"{what} file {path}", first, pa.Table.from_batches([batch]).select(names)
            first += batch.num_rows
