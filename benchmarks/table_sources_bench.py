"""Parquet rows into the cache job's preprocessing input (`TableDataSource.get_dataset`, what
`cache_writer.write_shard` reads), against Grain's `ParquetIterDataset` on the same files.

The files: `--files` Parquet files of `--rows` rows in row groups of 10,000, four columns (`id`,
`question`, `answer`, and `context`, a paragraph ten times the question's size). Rows:

* `TableDataSource`, two columns: the question and answer columns only (what a `text_to_text`
  task reads), pulled through tf.data 1,024 rows per step, as the cache writer pulls them;
* `TableDataSource`, all four columns;
* the same two columns from a fake-gcs-server bucket on this machine (`gs://`);
* Grain's `ParquetIterDataset` over the files (every column, one dict per row; it interleaves
  the files 16 at a time): the peer.

Each row is the median of `--repeats` reads after an untimed one; the ratio is to the Grain row.

    .venv/bin/python benchmarks/table_sources_bench.py               # 4 files x 50,000 rows
    .venv/bin/python benchmarks/table_sources_bench.py --rows 10000  # quick
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

REPO = pathlib.Path(__file__).absolute().parent.parent
for _lib in ("storage", "tokenizers", "datatasks"):
    sys.path.insert(0, str(REPO / _lib))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
BATCH = 1024  # rows pulled per step, as the cache writer's tf.data pipeline pulls them


def _write(folder: pathlib.Path, files: int, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    for i in range(files):
        q = [f"file {i} question {j}: " + "what does the lorem say? " * (1 + j % 3) for j in range(rows)]
        table = pa.table(
            {
                "id": list(range(rows)),
                "question": q,
                "answer": [f"answer {j} " + "ipsum " * (1 + j % 4) for j in range(rows)],
                "context": [s * 10 for s in q],
            }
        )
        pq.write_table(table, folder / f"part-{i}.parquet", row_group_size=10_000)


def _median_rate(read: Callable[[], int], repeats: int) -> tuple[float, int]:
    """(rows/s, rows): the median of `repeats` reads after one untimed (TensorFlow's first pipeline)."""
    read()
    times, count = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        count = read()
        times.append(time.perf_counter() - start)
    return count / statistics.median(times), count


def _cairn(root: str, columns: list[str] | None) -> Callable[[], int]:
    import cairn.datatasks as dt

    source = dt.TableDataSource({"train": root + "/part-*.parquet"}, "parquet", columns)

    def read() -> int:
        batches = source.get_dataset("train", shuffle=False).batch(BATCH).as_numpy_iterator()
        return sum(len(next(iter(b.values()))) for b in batches)

    return read


def _grain(folder: pathlib.Path) -> Callable[[], int]:
    import grain.experimental as ge

    paths = [str(p) for p in sorted(folder.glob("part-*.parquet"))]
    return lambda: sum(1 for _ in ge.ParquetIterDataset(paths))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--rows", type=int, default=50_000, help="rows per file")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    from cairn import storage
    from cairn.storage.testing import GcsEmulator

    with tempfile.TemporaryDirectory() as tmp, GcsEmulator() as emu:
        folder = pathlib.Path(tmp)
        _write(folder, args.files, args.rows)
        emu.activate()
        bucket = emu.create_bucket("tables")
        for f in sorted(folder.iterdir()):
            storage.copy_file(str(f), storage.join(bucket, f.name))
        rows = [
            ("TableDataSource, question + answer", "local disk", _cairn(str(folder), ["question", "answer"])),
            ("TableDataSource, all 4 columns", "local disk", _cairn(str(folder), None)),
            ("TableDataSource, question + answer", "gs:// emulator", _cairn(bucket, ["question", "answer"])),
            ("Grain ParquetIterDataset, all 4 columns", "local disk", _grain(folder)),
        ]
        results = [(name, where, *_median_rate(read, args.repeats)) for name, where, read in rows]
        peer = results[-1][2]
        print(f"{args.files} files x {args.rows:,} rows, median of {args.repeats} reads")
        print("| reader | files at | rows/s | / Grain |")
        print("|---|---|---|---|")
        for name, where, rate, count in results:
            assert count == args.files * args.rows, (name, count)
            print(f"| {name} | {where} | {rate:,.0f} | {rate / peer:.2f}x |")


if __name__ == "__main__":
    main()
