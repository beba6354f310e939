"""Shuffle quality of the deterministic reader's orders: "global" (a permutation over all
records) against "chunks" (a seeded order of chunks, rows shuffled within windows of chunks)
for several windows, on a synthetic cache, in the same run.

  PYTHONPATH=storage:tokenizers:datatasks .venv/bin/python benchmarks/shuffle_quality.py [--chunk G] [--batch B]

The cache: 4 sources of 8 files each (one shard per file, in source order, as the cache job
writes them); each file holds documents of 1 to ~30 consecutive records; the records of each
shard are then shuffled once, as the chunked cache writer will. The reader's own order code
(`read_order.ReadOrder`, `sort_rows`) gives the records of every global batch (unpacked: a row
is a record) for one epoch. Per order, the table prints means over the epoch's batches:

- docs/batch: distinct documents in a batch (of B rows);
- shards/batch: distinct shards (source files) in a batch (32 in all);
- src TV: total variation distance between a batch's source mix and the cache's (0: equal);
- next chunks: share of a batch's chunks also read by the previous batch (global: the
  chance that two random batches share a chunk);
- src corr: correlation of consecutive batches' source mixes (their deviations from the
  cache's mix; 0: independent batches);
- span: mean distance in the cache between two records of a batch, over the cache's size
  (1/3 for uniform positions);
- reads/1k rows: chunks of G records fetched per 1,000 rows (the request count) by one host
  reading every row, through an LRU of `--lru` decoded chunks; and by host 0 of 8, which reads
  its B/8 rows of each batch (with the "chunks" order, batch rows are sorted by first record;
  "unsorted" shows the same order without that sort).

A last table times the order at scale: 1e8 records in 10,000 shards, the first position of an
epoch (builds the epoch's window sums, O(chunks)) and then a batch at a random step.
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np

from cairn.datatasks.deterministic.chunk_order import chunk_bounds
from cairn.datatasks.deterministic.plan import Plan
from cairn.datatasks.deterministic.read_order import ReadOrder, base_order, sort_rows

SOURCES, FILES = 4, 8


def synthetic_cache(
    docs_per_file: int, shuffled: bool = True, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(offsets [shards + 1], doc [N], source [N])` of the cached records, in cache order
    (`shuffled`: each shard's records shuffled once, as the chunked writer will)."""
    rng, shuffle = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    doc_ids, sources, sizes = [], [], []
    next_doc = 0
    for shard in range(SOURCES * FILES):
        lengths = np.minimum(rng.geometric(1 / 6, docs_per_file), 30)
        docs = np.repeat(np.arange(next_doc, next_doc + docs_per_file), lengths)
        next_doc += docs_per_file
        if shuffled:
            docs = docs[shuffle.permutation(docs.size)]  # the writer's within-shard shuffle
        doc_ids.append(docs)
        sources.append(np.full(docs.size, shard // FILES))
        sizes.append(docs.size)
    return np.cumsum([0] + sizes), np.concatenate(doc_ids), np.concatenate(sources)


class Lru:
    """Counts the fetches of an LRU cache of `size` chunks."""

    def __init__(self, size: int):
        self.size, self.fetches, self._held = size, 0, collections.OrderedDict()

    def read(self, chunks: np.ndarray) -> None:
        for c in chunks.tolist():
            if c in self._held:
                self._held.move_to_end(c)
            else:
                self.fetches += 1
                self._held[c] = True
                if len(self._held) > self.size:
                    self._held.popitem(last=False)


def epoch_batches(order: ReadOrder, n: int, batch: int, sort: bool) -> np.ndarray:
    """`[steps, batch]` records of one epoch's global batches (unpacked rows), as the reader
    lays them out (sorted by first record with the chunk order)."""
    steps = n // batch
    _, records, _ = order.planned(np.arange(steps * batch, dtype=np.int64))
    if sort:
        records = records[sort_rows(np.zeros(records.size, np.int64), records, batch)]
    return records.reshape(steps, batch)


def quality(batches: np.ndarray, doc, source, shard, chunk, lru: int, hosts: int) -> dict[str, float]:
    n = doc.size
    global_mix = np.bincount(source, minlength=SOURCES) / n
    docs, shards, tv, overlap, span, dev = [], [], [], [], [], []
    previous: set | None = None
    for rows in batches:
        docs.append(np.unique(doc[rows]).size)
        shards.append(np.unique(shard[rows]).size)
        here = set(np.unique(chunk[rows]).tolist())
        if previous is not None:
            overlap.append(len(here & previous) / len(here))
        previous = here
        mix = np.bincount(source[rows], minlength=SOURCES) / rows.size
        tv.append(0.5 * np.abs(mix - global_mix).sum())
        dev.append(mix - global_mix)
        pos = np.sort(rows).astype(np.float64)
        k = pos.size  # mean |i - j| over pairs, from the sorted positions
        span.append(float((pos * (2 * np.arange(k) - k + 1)).sum() / (k * (k - 1) / 2)) / n)
    d = np.asarray(dev)
    corr = float((d[1:] * d[:-1]).sum() / np.sqrt((d[1:] ** 2).sum() * (d[:-1] ** 2).sum()))
    one, host = Lru(lru), Lru(lru)
    per_host = batches.shape[1] // hosts
    for rows in batches:
        one.read(chunk[rows])
        host.read(chunk[rows[:per_host]])
    rows_read = batches.size
    return {
        "docs/batch": float(np.mean(docs)),
        "shards/batch": float(np.mean(shards)),
        "src TV": float(np.mean(tv)),
        "next chunks": float(np.mean(overlap)),
        "src corr": corr,
        "span": float(np.mean(span)),
        "reads/1k rows": 1000 * one.fetches / rows_read,
        f"host 0 of {hosts} reads/1k": 1000 * host.fetches / (rows_read / hosts),
    }


def scale_row(records: float, shards: int, chunk: int, window: int, batch: int) -> dict[str, float]:
    """Seconds to the first batch of an epoch and to a batch at a random later step, unpacked."""
    n = int(records)
    offsets = np.linspace(0, n, shards + 1).astype(np.int64)
    start = time.perf_counter()
    order = ReadOrder(Plan(n), None, 0, "t", offsets, chunk, window)
    built = time.perf_counter() - start
    start = time.perf_counter()
    order.planned(np.arange(batch, dtype=np.int64))
    first = time.perf_counter() - start
    start = time.perf_counter()
    order.planned(np.arange(batch, dtype=np.int64) + n // 2 + 12345)
    later = time.perf_counter() - start
    return {"build": built, "first batch": first, "later batch": later}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=1500, help="documents per file (32 files)")
    parser.add_argument("--chunk", type=int, default=64, help="records per chunk (the cache's group_size)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--lru", type=int, default=128, help="decoded chunks kept")
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--windows", default="4,16,64,256")
    args = parser.parse_args(argv)

    offsets, doc, source = synthetic_cache(args.docs)
    _, doc_unshuffled, _ = synthetic_cache(args.docs, shuffled=False)
    n = doc.size
    shard = np.repeat(np.arange(offsets.size - 1), np.diff(offsets))
    bounds = chunk_bounds(offsets, args.chunk)
    chunk = np.searchsorted(bounds, np.arange(n), side="right") - 1
    print(
        f"synthetic cache: {n} records, {doc.max() + 1} documents, {offsets.size - 1} shards "
        f"({SOURCES} sources), {bounds.size - 1} chunks of {args.chunk}; batch {args.batch}, "
        f"LRU {args.lru} chunks, one epoch ({n // args.batch} batches)"
    )
    global_order = ReadOrder(Plan(n), base_order(n, 0, "t", "global"), 0, "t")
    configs: list[tuple[str, ReadOrder, bool, np.ndarray]] = [("global", global_order, False, doc)]
    for w in [int(x) for x in args.windows.split(",")]:
        order = ReadOrder(Plan(n), None, 0, "t", offsets, args.chunk, w)
        configs.append((f"chunks W={w}", order, True, doc))
        if w == 64:
            configs.append((f"chunks W={w}, rows unsorted", order, False, doc))
            configs.append((f"chunks W={w}, shards not shuffled", order, True, doc_unshuffled))
    rows = []
    for name, order, sort, docs in configs:
        batches = epoch_batches(order, n, args.batch, sort)
        rows.append((name, quality(batches, docs, source, shard, chunk, args.lru, args.hosts)))
    cols = list(rows[0][1])
    print("| order | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, q in rows:
        print(f"| {name} | " + " | ".join(f"{q[c]:.3g}" for c in cols) + " |")

    print("\norder at scale: 1e8 records, 10,000 shards, chunks of 64, W=64, batch 2048 (seconds)")
    s = scale_row(1e8, 10_000, 64, 64, 2048)
    print("| build | first batch of an epoch | a batch later in it |\n|---|---|---|")
    print(f"| {s['build']:.3f} | {s['first batch']:.3f} | {s['later batch']:.4f} |")


if __name__ == "__main__":
    main()
