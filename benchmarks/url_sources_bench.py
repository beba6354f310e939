"""Raw source files at a URL, read through `cairn.storage` (`cairn.datatasks.url_sources`),
against tf.data's native readers on the same files on local disk.

Rows: a `TextLineDataSource` split and a TFRecord split (`ProtoDataSource` keeping the raw
record), each of `--files` files, read whole (`get_dataset(shuffle=False)`, every element
pulled, 1,024 rows per step) from local paths (tf.data's `TextLineDataset` / `TFRecordDataset`: the peer), from the
same files as `file://` URLs (the storage path on local disk: the cost of the Python framing and
of the generator hand-off) and from a fake-gcs-server bucket on this machine (`gs://`). Each
row is the median of `--repeats` reads; the ratio is to the local tf.data row of its format.

    .venv/bin/python benchmarks/url_sources_bench.py               # 4 files x 50,000 rows, ~1 min
    .venv/bin/python benchmarks/url_sources_bench.py --rows 10000  # quick
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).absolute().parent.parent
for _lib in ("storage", "tokenizers", "datatasks"):
    sys.path.insert(0, str(REPO / _lib))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
BATCH = 1024  # rows pulled per step (one Python step per row would measure the iteration, not the read)


def _write(folder: pathlib.Path, files: int, rows: int) -> None:
    from cairn.datatasks.lazy_tf import tf

    for i in range(files):
        lines = [f"file {i} row {j} " + "lorem ipsum dolor sit amet " * (1 + j % 5) for j in range(rows)]
        (folder / f"part-{i}.txt").write_text("\n".join(lines) + "\n")
        with tf.io.TFRecordWriter(str(folder / f"part-{i}.tfrecord")) as w:
            for line in lines:
                w.write(line.encode())


def _source(kind: str, root: str):
    import cairn.datatasks as dt

    if kind == "lines":
        return dt.TextLineDataSource({"train": root + "/part-*.txt"})
    return dt.ProtoDataSource({"train": root + "/part-*.tfrecord"}, lambda record: {"record": record})


def _rate(kind: str, root: str, repeats: int) -> tuple[float, int]:
    """(rows/s, rows) of reading the split whole, the median of `repeats` reads."""
    source = _source(kind, root)
    times, count = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        batches = source.get_dataset("train", shuffle=False).batch(BATCH).as_numpy_iterator()
        count = sum(len(next(iter(b.values())) if isinstance(b, dict) else b) for b in batches)
        times.append(time.perf_counter() - start)
    return count / statistics.median(times), count


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
        bucket = emu.create_bucket("sources")
        for f in sorted(folder.iterdir()):
            storage.copy_file(str(f), storage.join(bucket, f.name))
        print(f"{args.files} files x {args.rows:,} rows, median of {args.repeats} reads")
        print("| format | files at | rows/s | / local tf.data |")
        print("|---|---|---|---|")
        for kind in ("lines", "tfrecord"):
            peer = None
            for where, root in (
                ("local disk, tf.data", tmp),
                ("file://, storage", "file://" + tmp),
                ("gs:// emulator", bucket),
            ):
                rate, count = _rate(kind, root, args.repeats)
                assert count == args.files * args.rows, (where, count)
                peer = peer or rate
                print(f"| {kind} | {where} | {rate:,.0f} | {rate / peer:.2f}x |")


if __name__ == "__main__":
    main()
