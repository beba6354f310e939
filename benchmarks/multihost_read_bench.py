"""Several hosts reading one bucket at once: per-host rows/s and memory, and the global batches checked.

  .venv/bin/python benchmarks/multihost_read_bench.py [--records 1e5] [--shards 100] [--hosts 4]
      [--steps 300] [--batch 32] [--modes packed] [--root DIR]

The synthetic cache of `reader_scale_bench.py` (short token rows, the writer's format and chunk
size: format 4, 512 records a chunk) is uploaded to a fake-gcs-server bucket started here. Then, per mode, in one run:

1. one process (host 0 of 1) reads the whole global batch of `--batch` rows for `--steps` steps;
2. `--hosts` processes (host 0..H-1 of H) start together and each reads its `--batch / H` rows of
   the same global batches, all at once from the same bucket.

Each process builds a `DeterministicReader` over the bucket (default options: the chunk read
order, prefetch), reads 5 warm-up steps, then times `--steps` steps: its steady rows/s (its own
rows), its RSS above the imports, and its chunk fetches (at a URL one request each) per 1,000 of
its rows. It writes one SHA-256 digest per row per step; the parent checks that the hosts'
shares, concatenated in host order, equal the single process's rows at every step, prints the
verdict, and exits 1 if they differ.

This machine has 2 cores: H processes and the emulator share them, so per-host rows/s fall
with H; the aggregate (the sum over hosts) is the figure to compare with one process.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import reader_scale_bench as rsb  # benchmarks/ is sys.path[0] when run as a script
from _machine import machine_line

WARMUP = 5


def row_digests(batch: dict) -> list[str]:
    """One SHA-256 per row of `batch` (all its features, in name order)."""
    rows = len(next(iter(batch.values())))
    out = []
    for i in range(rows):
        h = hashlib.sha256()
        for k in sorted(batch):
            h.update(k.encode() + batch[k][i].tobytes())
        out.append(h.hexdigest())
    return out


def read_share(cache_dir: str, src_dir: str, pack: bool, host: int, hosts: int, batch: int, steps: int) -> dict:
    """This process's share (host `host` of `hosts`) of `steps` global batches: its figures and
    its rows' digests per step."""
    task = rsb.make_task(src_dir)
    base = rsb.rss_mb()
    reader = rsb.open_reader(task, cache_dir, pack, batch, host_index=host, host_count=hosts)
    digests = [row_digests(next(reader)) for _ in range(WARMUP)]
    cache = reader.streams[0].cache
    before = cache.stats()
    start, began = time.perf_counter(), time.time()
    batches = [next(reader) for _ in range(steps)]
    seconds = time.perf_counter() - start
    after = cache.stats()
    digests += [row_digests(b) for b in batches]
    rows = steps * batch // hosts
    reader.close()
    return {
        "host": host,
        "hosts": hosts,
        "rows_per_s": rows / seconds,
        "began": began,  # wall clock: the span over all hosts gives the aggregate rate
        "ended": began + seconds,
        "rss_above_mb": rsb.peak_rss_mb() - base,
        "fetches_per_1000": (after["chunk_fetches"] - before["chunk_fetches"]) * 1000 / rows,
        "opens_per_1000": (after["shard_opens"] - before["shard_opens"]) * 1000 / rows,
        "digests": digests,
    }


def run_hosts(argv: list[str], hosts: int, env: dict) -> list[dict]:
    """Starts `hosts` children (this script with `argv` plus `--child h,hosts`) at once; returns
    their results in host order. Kills any still running on the way out."""
    children = [
        subprocess.Popen(
            argv + ["--child", f"{h},{hosts}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for h in range(hosts)
    ]
    try:
        outputs = [c.communicate() for c in children]
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait()
    results = []
    for h, (c, (out, err)) in enumerate(zip(children, outputs)):
        if c.returncode != 0:
            raise SystemExit(f"host {h} of {hosts} failed:\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def matches(single: dict, shares: list[dict], mode: str) -> bool:
    """Whether the hosts' rows, concatenated in host order, are the single process's at every
    step (prints the first step where they are not)."""
    for step, whole in enumerate(single["digests"]):
        if [d for share in shares for d in share["digests"][step]] != whole:
            print(f"{mode}: step {step - WARMUP}: the {len(shares)} hosts' rows differ from one process's")
            return False
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", default="1e5")
    p.add_argument("--shards", type=int, default=100)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--steps", type=int, default=300, help="timed steps per process (after 5 warm-up steps)")
    p.add_argument("--batch", type=int, default=32, help="global batch size (a multiple of --hosts)")
    p.add_argument("--modes", default="packed", help="packed and/or unpacked")
    p.add_argument("--root", help="keep (and reuse) the synthetic cache in this directory")
    p.add_argument("--workers", type=int, default=2, help="processes writing shards")
    p.add_argument("--child", help="internal: HOST,HOSTS read in this process")
    p.add_argument("--cache_dir", help="internal: the cache to read")
    p.add_argument("--pack", type=int, default=1, help="internal: 1 packed, 0 unpacked")
    args = p.parse_args()
    n = int(float(args.records))
    here = os.path.dirname(os.path.abspath(__file__))
    libs = [os.path.join(os.path.dirname(here), lib) for lib in ("storage", "tokenizers", "datatasks")]
    sys.path[:0] = libs
    if args.child:
        host, hosts = (int(x) for x in args.child.split(","))
        src_dir = rsb.paths(args.root, n)[0]
        json.dump(read_share(args.cache_dir, src_dir, args.pack == 1, host, hosts, args.batch, args.steps), sys.stdout)
        return
    if args.batch % args.hosts:
        raise SystemExit(f"--batch {args.batch} must be a multiple of --hosts {args.hosts}")
    print(machine_line(), flush=True)
    root = args.root or tempfile.mkdtemp(prefix="cairn-multihost-")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(libs + [os.environ.get("PYTHONPATH", "")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    rows, same = [], True
    try:
        with rsb.in_emulator(root, n, args.shards, args.workers, env, "multihost") as (env, bucket):
            for mode in [m.strip() for m in args.modes.split(",")]:
                argv = [sys.executable, os.path.abspath(__file__), "--root", root, "--records", str(n)]
                argv += ["--cache_dir", rsb.bucket_cache(bucket, n), "--pack", str(int(mode == "packed"))]
                argv += ["--steps", str(args.steps), "--batch", str(args.batch)]
                single = run_hosts(argv, 1, env)[0]
                shares = run_hosts(argv, args.hosts, env)
                same = same and matches(single, shares, mode)
                rows.append((mode, single, shares))
    finally:
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)
    from cairn.datatasks.deterministic.cache_writer import DEFAULT_GROUP_SIZE, FORMAT_VERSION

    print(
        f"\n{n:,} records in {args.shards} shards (format {FORMAT_VERSION}, {DEFAULT_GROUP_SIZE} records a chunk) "
        "in a fake-gcs-server bucket; "
        f"EncDec {rsb.LENGTHS}, global batch {args.batch}; {args.steps} timed steps after {WARMUP}\n"
    )
    print("| mode | processes | host | steady rows/s (its rows) | RSS above imports MB | chunk fetches / 1,000 rows |")
    print("|---|---|---|---|---|---|")
    for mode, single, shares in rows:
        for r in [single] + shares:
            print(
                f"| {mode} | {r['hosts']} | {r['host']} | {r['rows_per_s']:,.0f} | {r['rss_above_mb']:+,.0f} "
                f"| {r['fetches_per_1000']:,.0f} |"
            )
        span = max(r["ended"] for r in shares) - min(r["began"] for r in shares)
        total = args.steps * args.batch / span  # all hosts' rows over the span they read in
        print(
            f"| {mode} | {args.hosts} | all | {total:,.0f} ({total / single['rows_per_s']:.2f}x one process) "
            f"| {sum(r['rss_above_mb'] for r in shares):+,.0f} (sum) | "
            f"{sum(r['fetches_per_1000'] * args.batch // args.hosts for r in shares) / args.batch:,.0f} |"
        )
    verdict = "identical" if same else "DIFFERENT"
    print(f"\nglobal batches of {args.hosts} hosts vs 1 process, {args.steps + WARMUP} steps per mode: {verdict}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
