"""Read-ahead against a bucket: the reader's steady rows/s from the emulator vs local disk, by prefetch.

  .venv/bin/python benchmarks/read_ahead_bench.py [--records 1e6] [--shards 1000] [--prefetch 0,2,8]
      [--latency_ms 0,20] [--seconds 3] [--modes packed] [--group_size 64] [--root DIR]

The synthetic cache of `reader_scale_bench.py` (short token rows, `--group_size` records a
chunk, default the writer's 512; the default chunk read order; format 4: a chunk is one ranged
read), on local disk and uploaded to a
fake-gcs-server bucket started here. Each row is one fresh process: a `DeterministicReader`
(EncDec, global batch 32, inputs 128 / targets 64) with `prefetch=P`; every shard is opened first
(one record read from each: the steady state of a long run, where the open-shard LRU holds them
all), then 5 warm-up steps, then `--seconds` of steps. Printed per row: steady rows/s and its
ratio to local disk at the same prefetch, the HTTP requests per 1,000 rows and per 1,000
records (chunk fetches plus shard opens: each is one GET to the emulator; format 4 opens none), the reader's CPU
milliseconds per 1,000 rows, and the process's peak RSS above its imports.

`--latency_ms L` (for L > 0) adds rows where every request to the bucket (a shard open, a chunk
read; format 4: each call of ranged reads, whose requests are in flight together) first waits
L ms in the reading thread, as a real bucket's round trip would (the emulator
on loopback answers in well under a millisecond): what read-ahead has to hide on a pod host.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import reader_scale_bench as rsb  # benchmarks/ is sys.path[0] when run as a script
from _machine import machine_line

WARMUP = 5


def add_latency(seconds: float) -> None:
    """Makes every request to the bucket in this process wait `seconds` first: each ArrayRecord
    shard open and read (formats 2 and 3; the reader imports the class when it opens a shard,
    so patching the module is enough), and each `storage.read_ranges` call at a URL (format 4:
    its ranged GETs are in flight together, so the call waits once, as concurrent requests do)."""
    from array_record.python import array_record_module

    from cairn import storage

    ranges = storage.read_ranges

    def slow_ranges(requests):
        if any(storage.is_url(r[0]) for r in requests):
            time.sleep(seconds)
        return ranges(requests)

    storage.read_ranges = slow_ranges

    real = array_record_module.ArrayRecordReader

    class SlowReader:
        def __init__(self, *args):
            time.sleep(seconds)
            self._reader = real(*args)

        def read(self, *args):
            time.sleep(seconds)
            return self._reader.read(*args)

        def close(self):
            self._reader.close()

    array_record_module.ArrayRecordReader = SlowReader


def measure(cache_dir: str, src_dir: str, pack: bool, prefetch: int, latency_ms: float, seconds: float) -> dict:
    """One row, in this (fresh) process."""
    if latency_ms > 0:
        add_latency(latency_ms / 1000)
    task = rsb.make_task(src_dir)
    base = rsb.rss_mb()
    reader = rsb.open_reader(task, cache_dir, pack, prefetch=prefetch)
    cache = reader.streams[0].cache
    cache.read(cache.offsets[:-1])  # every shard open (a long run's steady state)
    for _ in range(WARMUP):
        next(reader)
    before = cache.stats()
    start, cpu, steps, examples = time.perf_counter(), time.process_time(), 0, 0
    while time.perf_counter() - start < seconds or steps < 20:
        batch = next(reader)
        steps += 1
        examples += int(batch["encoder_segment_ids"].max(axis=1).sum()) if pack else rsb.BATCH
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    after = cache.stats()
    reader.close()
    rows = steps * rsb.BATCH
    requests = sum(after[k] - before[k] for k in ("chunk_fetches", "shard_opens"))
    return {
        "prefetch": prefetch,
        "latency_ms": latency_ms,
        "where": "gcs" if "://" in cache_dir else "local",
        "rows_per_s": rows / wall,
        "requests_per_1000_rows": requests * 1000 / rows,
        "requests_per_1000_records": requests * 1000 / examples,
        "cpu_ms_per_1000_rows": cpu * 1e6 / rows,
        "rss_above_mb": rsb.peak_rss_mb() - base,
        "records_per_row": examples / rows,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", default="1e6")
    p.add_argument("--shards", type=int, default=1000)
    p.add_argument("--prefetch", default="0,2,8", help="the reader's prefetch values, comma-separated")
    p.add_argument("--latency_ms", default="0,20", help="added per request to the bucket, comma-separated")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--modes", default="packed", help="packed and/or unpacked")
    p.add_argument("--root", help="keep (and reuse) the synthetic cache in this directory")
    p.add_argument("--workers", type=int, default=2, help="processes writing shards")
    p.add_argument("--group_size", type=int, help="records per chunk of the cache (default: the writer's)")
    p.add_argument("--child", help="internal: CACHE_DIR,PACK,PREFETCH,LATENCY_MS measured in this process")
    args = p.parse_args()
    n = int(float(args.records))
    tag = f"_g{args.group_size}" if args.group_size else ""  # reader_scale_bench's name for it
    here = os.path.dirname(os.path.abspath(__file__))
    libs = [os.path.join(os.path.dirname(here), lib) for lib in ("storage", "tokenizers", "datatasks")]
    sys.path[:0] = libs
    if args.child:
        cache_dir, pack, prefetch, latency = args.child.rsplit(",", 3)
        src_dir = rsb.paths(args.root, n, tag)[0]
        json.dump(measure(cache_dir, src_dir, pack == "1", int(prefetch), float(latency), args.seconds), sys.stdout)
        return
    print(machine_line(), flush=True)
    from cairn.datatasks.deterministic.cache_writer import DEFAULT_GROUP_SIZE

    group = args.group_size or DEFAULT_GROUP_SIZE
    root = args.root or tempfile.mkdtemp(prefix="cairn-read-ahead-")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(libs + [os.environ.get("PYTHONPATH", "")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    prefetches = [int(x) for x in args.prefetch.split(",")]
    latencies = [float(x) for x in args.latency_ms.split(",")]
    rows = []
    try:
        with rsb.in_emulator(root, n, args.shards, args.workers, env, "read-ahead", args.group_size, tag) as (
            env,
            bucket,
        ):
            places = [("local", rsb.paths(root, n, tag)[1], 0.0)]
            places += [("gcs", rsb.bucket_cache(bucket, n, tag), latency) for latency in latencies]
            for mode in [m.strip() for m in args.modes.split(",")]:
                for _, cache_dir, latency in places:
                    for prefetch in prefetches:
                        child = f"{cache_dir},{int(mode == 'packed')},{prefetch},{latency}"
                        argv = [sys.executable, os.path.abspath(__file__), "--root", root, "--records", str(n)]
                        argv += ["--seconds", str(args.seconds), "--child", child]
                        argv += ["--group_size", str(args.group_size)] if args.group_size else []
                        rows.append(dict(rsb.measure_in_child(argv, env, child), mode=mode))
    finally:
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)
    print(
        f"\n{n:,} records in {args.shards} shards (format 4, {group} records a chunk, chunk read order); EncDec "
        f"{rsb.LENGTHS}, global batch {rsb.BATCH}; every shard open first, {WARMUP} warm-up steps, {args.seconds} s\n"
    )
    local = {(r["mode"], r["prefetch"]): r["rows_per_s"] for r in rows if r["where"] == "local"}
    print(
        "| mode | storage | added latency per request | prefetch | rows/s | vs local | requests / 1,000 rows "
        "| requests / 1,000 records | reader CPU ms / 1,000 rows | peak RSS above imports MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mode = f"{r['mode']} ({r['records_per_row']:.1f}/row)"
        ratio = r["rows_per_s"] / local[(r["mode"], r["prefetch"])]
        print(
            f"| {mode} | {r['where']} | {r['latency_ms']:g} ms | {r['prefetch']} | {r['rows_per_s']:,.0f} "
            f"| {ratio:.2f}x | {r['requests_per_1000_rows']:,.0f} | {r['requests_per_1000_records']:,.1f} "
            f"| {r['cpu_ms_per_1000_rows']:,.0f} | {r['rss_above_mb']:+,.0f} |"
        )


if __name__ == "__main__":
    main()
