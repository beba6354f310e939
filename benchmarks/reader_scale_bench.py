"""How the deterministic reader's start-up, seek and memory grow with the cache: 1e5-1e7 record_stage.

  .venv/bin/python benchmarks/reader_scale_bench.py [--sizes 1e5,1e6,1e7] [--shards 1000]
      [--root DIR] [--repeats 3] [--workers 2] [--modes packed,unpacked] [--storage local,gcs]

For each size, a synthetic cached task (no tokenizing): `--shards` ArrayRecord shards of short
token rows (inputs 4-23 ids, targets 2-13; records drawn with a seeded generator from a pool
of 4,096 distinct ones), written with the cache writer's own functions
(`cache_writer.write_shard_files`, one ArrayRecord writer per shard, then `finalize`), so
`info.json`, the shard checksums and `lengths.npy` are what `cache_tasks` writes. The task,
`reader_scale`, reads one tiny text file per shard (its source files: start-up lists and
stats them, as `check_source_files=True` does), caches nothing (no cacheable preprocessor)
and runs `append_eos_after_trim` after the cache; EncDecFeatureConverter, inputs 128 /
targets 64, global batch 32.

Each (size, mode) is measured in a fresh subprocess (so the peak RSS is that size's):
  * reader construction (open the cache, check its metadata, plan the packing): the first
    (which builds the packed plan and stores it beside the cache), then the median of the
    later `--repeats - 1` (which memory-map the stored plan);
  * time to the first batch of a fresh reader (no prefetch, one step per call) at step 0 and
    at step 1,000,000 (`set_state`), median of `--repeats` after one warm-up round;
  * steady rows/s (default prefetch) over >= 3 s;
  * peak RSS of the process, and its growth above the RSS after the imports (TensorFlow
    alone is ~0.7 GB).
Medians; wall-clock and CPU seconds of the construction (this machine is shared: CPU time is
the steadier figure).

`--root DIR` keeps the synthetic caches in DIR (reused by later runs) instead of a temporary
directory. `--storage local,gcs` measures each cache on local disk and again as a copy in a
bucket of a fake-gcs-server started here (uploaded object by object; the reader then reads
its chunks by ranged GETs and copies `lengths.npy` once to a local file), with the
construction time's ratio to local disk.

The emulator keeps its objects on disk (`--emulator filesystem`, the default; under
`--root`, in `<root>/gcs-emulator`, so a later run finds the cache uploaded and skips the
upload): fake-gcs-server's memory backend (`--emulator memory`, what runs before 2026-12-07
used) finds an object by scanning every object of the bucket, ~4 ms of its CPU per request
at 10,000 shards, which no real bucket costs its client's host. With `--steps`, each row
also has the CPU seconds per 1,000 rows of the reader's process and of the emulator's
process over the steady window, and the machine's load average at its start and end: the
machine is shared, and CPU per row moves far less with its load than rows/s does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

from _machine import machine_line  # benchmarks/ is sys.path[0] when run as a script

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LENGTHS = {"inputs": 128, "targets": 64}
BATCH = 32
FAR_STEP = 1_000_000
POOL = 4096
NAME = "reader_scale"


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def rss_parts_mb() -> tuple[float, float]:
    """`(anonymous, file-backed)` resident MB (/proc/self/status `RssAnon`, `RssFile`): the
    reader's own memory, and the pages of memory-mapped files (the plan, the lengths) it has
    touched, which the kernel can drop and processes share."""
    parts = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                parts[key] = int(value.split()[0]) / 1024
    return parts.get("RssAnon", 0.0), parts.get("RssFile", 0.0)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def process_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system, all threads) of process `pid` so far (0 without one)."""
    if not pid:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_average() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def paths(root: str, n: int, tag: str = "") -> tuple[str, str]:
    """`(source dir, cache dir)` of the synthetic task of `n` records (`tag`: a variant)."""
    base = os.path.join(root, f"{NAME}_{n}{tag}")
    return os.path.join(base, "src"), os.path.join(base, "cache")


def make_task(src_dir: str):
    import cairn.datatasks as dt
    from cairn.datatasks import preprocessors as pp
    from cairn.tokenizers import ByteVocabulary

    vocab = ByteVocabulary()
    feats = {"inputs": dt.Feature(vocab), "targets": dt.Feature(vocab)}
    source = dt.TextLineDataSource({"train": os.path.join(src_dir, "part-*.txt")})
    return dt.Task(NAME, source, feats, [pp.append_eos_after_trim])


def open_reader(task, cache_dir: str, pack: bool, batch: int = BATCH, **kwargs):
    """A `DeterministicReader` of the synthetic `task` over `cache_dir` (seed 0, EncDec `LENGTHS`)."""
    import cairn.datatasks as dt
    from cairn.datatasks.deterministic import DeterministicReader

    return DeterministicReader(
        task,
        cache_dir,
        seed=0,
        global_batch_size=batch,
        sequence_length=LENGTHS,
        feature_converter=dt.EncDecFeatureConverter(pack=pack),
        **kwargs,
    )


def pool(scale: int = 1):
    """`(serialized records, [POOL, 2] lengths)`: the distinct records the shards draw from
    (`scale` times longer rows than the default)."""
    import numpy as np

    from cairn.datatasks.deterministic import record_stage

    rng = np.random.default_rng(1234)
    specs = {"inputs": record_stage.FeatureSpec("int32", 1), "targets": record_stage.FeatureSpec("int32", 1)}
    lens = np.stack([rng.integers(4, 24, POOL), rng.integers(2, 14, POOL)], 1).astype(np.int32) * scale
    recs = [
        record_stage.serialize({"inputs": rng.integers(3, 259, a), "targets": rng.integers(3, 259, b)}, specs)
        for a, b in lens
    ]
    return recs, lens


def shard_bounds(n: int, shards: int) -> list[tuple[int, int]]:
    return [(n * s // shards, n * (s + 1) // shards) for s in range(shards)]


def write_shards(args: tuple) -> int:
    """Writes shards `todo` of the cache of `n` records (run in a worker process)."""
    n, shards, todo, src_dir, path, group_size, scale = args
    import numpy as np

    from cairn.datatasks.deterministic import cache_writer
    from cairn.datatasks.deterministic.fingerprint import file_fingerprint
    from cairn.datatasks.sources import SourceFile

    recs, lens = pool(scale)
    bounds = shard_bounds(n, shards)
    feats = {"inputs": {"dtype": "int32", "rank": 1}, "targets": {"dtype": "int32", "rank": 1}}
    for s in todo:
        a, b = bounds[s]
        pick = np.random.default_rng([n, s]).integers(0, POOL, b - a)
        name = f"part-{s:05d}.txt"
        src = file_fingerprint(SourceFile(0, os.path.join(src_dir, name), name))
        cache_writer.write_shard_files(
            path,
            s,
            shards,
            (recs[i] for i in pick.tolist()),
            lens[pick],
            feats,
            ["inputs", "targets"],
            {},
            src,
            group_size=group_size,
            shuffle=f"{NAME}-{n}",
        )
    return len(todo)


def build(
    root: str, n: int, shards: int, workers: int, group_size: int | None = None, scale: int = 1, tag: str = ""
) -> float | None:
    """Writes the synthetic cache of `n` records (unless complete); returns seconds or None."""
    from cairn.datatasks.deterministic import cache_writer, store

    group_size = group_size or cache_writer.DEFAULT_GROUP_SIZE
    src_dir, cache_dir = paths(root, n, tag)
    path = store.task_dir(cache_dir, NAME, "train")
    if store.is_completed(path):
        return None
    start = time.perf_counter()
    os.makedirs(src_dir, exist_ok=True)
    for s in range(shards):
        with open(os.path.join(src_dir, f"part-{s:05d}.txt"), "w", encoding="utf-8") as f:
            f.write(f"synthetic shard {s} of {shards}\n")
    cache_writer.prepare(path, overwrite=True)
    jobs = [(n, shards, list(range(w, shards, workers)), src_dir, path, group_size, scale) for w in range(workers)]
    if workers > 1:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(workers) as p:
            p.map(write_shards, jobs)
    else:
        write_shards(jobs[0])
    cache_writer.finalize(make_task(src_dir), "train", path, shards)
    for s in range(shards):  # the per-shard summaries are the job's scratch
        for ext in (".json", ".lengths.npy"):
            os.remove(os.path.join(path, store.shard_name(s, shards) + ext))
    return time.perf_counter() - start


def bucket_cache(bucket: str, n: int, tag: str = "") -> str:
    """Where the emulator copy of the cache of `n` records lives."""
    return f"{bucket}/{NAME}_{n}{tag}/cache"


def upload(root: str, n: int, bucket: str, tag: str = "") -> float:
    """Copies the local cache of `n` records into the bucket (each file one whole object;
    those already there with their size, from an earlier run on a `--root`'s emulator, are
    kept); returns seconds."""
    from cairn import storage

    _, cache_dir = paths(root, n, tag)
    start = time.perf_counter()
    there = storage.file_sizes(bucket_cache(bucket, n, tag))
    for rel, size in storage.file_sizes(cache_dir).items():
        if there.get(rel) == size:
            continue
        with open(os.path.join(cache_dir, rel), "rb") as f:
            storage.write_bytes(storage.join(bucket_cache(bucket, n, tag), *rel.split("/")), f.read())
    return time.perf_counter() - start


def start_emulator(kind: str, root: str):
    """A started fake-gcs-server: `kind` "filesystem" keeps its objects on disk, in
    `<root>/gcs-emulator` (a `--root` keeps them for later runs), "memory" in memory (an
    object found by a scan of its bucket: O(objects) CPU per request)."""
    from cairn.storage.testing import GcsEmulator

    if kind == "memory":
        return GcsEmulator().start()
    if kind != "filesystem":
        raise SystemExit(f"--emulator must be filesystem or memory, got {kind!r}")
    return GcsEmulator(root=os.path.join(root, "gcs-emulator")).start()


@contextlib.contextmanager
def in_emulator(
    root: str,
    n: int,
    shards: int,
    workers: int,
    env: dict,
    name: str,
    group_size: int | None = None,
    tag: str = "",
    kind: str = "memory",
) -> Iterator[tuple[dict, str]]:
    """Builds the cache of `n` records (unless complete), starts a fake-gcs-server (`kind`:
    see `start_emulator`) and uploads the cache to its bucket `name`; yields `(env pointing
    children at it, gs://name)` and stops the server on the way out."""
    emulator = start_emulator(kind, root)
    try:
        emulator.activate()
        bucket = emulator.create_bucket(name)
        env = dict(emulator.environ(env), CAIRN_CACHE_HOME=os.path.join(root, "cairn-cache-home"))
        seconds = build(root, n, shards, workers, group_size, tag=tag)
        if seconds is not None:
            print(f"built {n:,} records in {shards} shards: {seconds:.1f} s", flush=True)
        print(f"uploaded to the emulator: {upload(root, n, bucket, tag):.1f} s", flush=True)
        yield env, bucket
    finally:
        emulator.stop()


def measure(
    root: str,
    n: int,
    pack: bool,
    repeats: int,
    cache_dir: str | None = None,
    tag: str = "",
    steps: int = 0,
    emulator_pid: int | None = None,
    emulator: str = "filesystem",
) -> dict:
    """One (size, mode) in this (fresh) process; `cache_dir` (e.g. a gs:// copy) instead of
    the local cache. The far step is `FAR_STEP`, or with `steps` (the growth table, issue 37)
    the last step of the first epoch; the steady rate is then `steps` steps, with the RSS after
    them, the chunk fetches and shard opens per 1,000 rows, and the CPU seconds per 1,000 rows
    of this process and of the emulator (`emulator_pid`) over those steps."""

    src_dir, local_cache = paths(root, n, tag)
    cache_dir = cache_dir or local_cache
    task = make_task(src_dir)
    base_rss = rss_mb()
    base_anon, _ = rss_parts_mb()

    def make(**kwargs):
        return open_reader(task, cache_dir, pack, **kwargs)

    walls, cpus = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        reader = make()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
        bins = reader.streams[0].plan.num_bins
        reader.close()
        del reader
    far = FAR_STEP
    if steps:  # the last step of the first epoch: a plan's bins (or records) over the batch
        far = max(1, bins // BATCH - 1)
    firsts: dict = {0: [], far: []}
    for step in (0, far) * (repeats + 1):  # the first round is dropped: warm-up
        reader = make(prefetch=0, steps_per_call=1)
        start = time.perf_counter()
        reader.set_state({**reader.get_state(), "step": step})
        next(reader)
        firsts[step].append(time.perf_counter() - start)
        reader.close()
    reader = make()
    for _ in range(5):
        next(reader)
    cache = reader.streams[0].cache
    before = cache.stats()
    load_before = load_average()
    cpu, emulator_cpu = time.process_time(), process_cpu_s(emulator_pid)
    start, count = time.perf_counter(), 0
    while (count < steps) if steps else (time.perf_counter() - start < 3.0 or count < 20):
        batch = next(reader)
        count += 1
    seconds = time.perf_counter() - start
    cpu, emulator_cpu = time.process_time() - cpu, process_cpu_s(emulator_pid) - emulator_cpu
    after = cache.stats()
    rss_after = rss_mb()
    anon_after, file_after = rss_parts_mb()
    examples = int(batch["encoder_segment_ids"].max(axis=1).sum()) if pack else BATCH
    rows_read = count * BATCH
    reader.close()
    return {
        "n": n,
        "pack": pack,
        "where": f"gcs ({emulator})" if "://" in cache_dir else "local",
        "bins": bins,
        # The first construction builds (and, packed, stores) the plan; the later ones map it.
        "first_build_s": walls[0],
        "build_s": statistics.median(walls[1:] or walls),
        "build_cpu_s": statistics.median(cpus[1:] or cpus),
        "first_0_s": statistics.median(firsts[0][1:]),
        "far_step": far,
        "first_far_s": statistics.median(firsts[far][1:]),
        "rows_per_s": count * BATCH / seconds,
        "steps": count,
        # CPU seconds per 1,000 rows over the steady steps: this process (all its threads) and
        # the emulator's (gcs only); the load average at their start and end
        "reader_cpu_s_per_1000_rows": cpu * 1000 / (count * BATCH),
        "emulator_cpu_s_per_1000_rows": emulator_cpu * 1000 / (count * BATCH),
        "load": [load_before, load_average()],
        "rss_after_mb": rss_after,
        "anon_above_imports_mb": anon_after - base_anon,  # of rss_after: the reader's own memory
        "file_rss_after_mb": file_after,  # of rss_after: mapped files' pages (plan, lengths)
        # per 1,000 rows: at a URL each chunk fetch is one request, and each shard open a few
        "fetches_per_1000_rows": (after["chunk_fetches"] - before["chunk_fetches"]) * 1000 / rows_read,
        "opens_per_1000_rows": (after["shard_opens"] - before["shard_opens"]) * 1000 / rows_read,
        "open_shards": after["open_shards"],
        "examples_per_row": examples / BATCH,
        "base_rss_mb": base_rss,
        "peak_rss_mb": peak_rss_mb(),
    }


def measure_chunks(path: str, seconds: float) -> dict:
    """Reads the cache at `path` with `CachedTask` alone (no reader, no LRU of chunks): the
    memory of every shard open, rows/s reading whole random chunks (8 per call) and single
    random records (32 per call, each costing its chunk), and the chunk fetches per 1,000 rows."""
    import numpy as np

    from cairn.datatasks.deterministic.cached_task import CachedTask

    cache = CachedTask(path, chunk_cache_bytes=0, open_shards_bytes=1 << 50)
    shards = len(cache.offsets) - 1
    cache.read([0])  # the first shard also loads array-record (and at a URL, its client)
    base = rss_mb()
    start = time.perf_counter()
    for s in range(1, shards):
        cache.read([int(cache.offsets[s])])
    open_s = (time.perf_counter() - start) / (shards - 1)
    open_kb = (rss_mb() - base) * 1024 / (shards - 1)
    g, base_of = cache.group_size, cache._chunk_base
    rng = np.random.default_rng(0)

    def rate(batch_ids) -> tuple[float, float]:
        before = cache.stats()["chunk_fetches"]
        start, rows = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            rows += len(cache.read(batch_ids()))
        return rows / (time.perf_counter() - start), (cache.stats()["chunk_fetches"] - before) * 1000 / rows

    def whole_chunks() -> np.ndarray:
        out = []
        for c in rng.integers(0, cache.num_chunks, 8).tolist():
            s = int(np.searchsorted(base_of, c, side="right")) - 1
            first = int(cache.offsets[s]) + (c - int(base_of[s])) * g
            out.append(np.arange(first, min(first + g, int(cache.offsets[s + 1]))))
        return np.concatenate(out)

    whole, _ = rate(whole_chunks)
    single, per_1000 = rate(lambda: rng.integers(0, cache.num_records, 32))
    size = sum(int(s["bytes"]) for s in cache.info["shards"])
    cache.close()
    return {
        "group_size": g,
        "where": "gcs" if "://" in path else "local",
        "mb": size / 2**20,
        "record_bytes": size / cache.num_records,
        "open_s": open_s,
        "open_kb": open_kb,
        "whole_rows_per_s": whole,
        "single_rows_per_s": single,
        "fetches_per_1000": per_1000,
    }


def measure_in_child(argv: list, env: dict, what: str) -> dict:
    """Runs a measuring child (this script with `argv`), prints and returns its last JSON line."""
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"measuring {what} failed:\n{proc.stderr[-3000:]}")
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    print(json.dumps(row), flush=True)
    return row


def group_size_table(args, env: dict) -> None:
    """`--group_sizes`: one cache per group size (`--sizes`' first, `--shards`, rows `--scale`
    times the default's), each read by `measure_chunks` in a fresh process per storage."""
    from cairn.datatasks.deterministic import store

    n = int(float(args.sizes.split(",")[0]))
    wheres = [w.strip() for w in args.storage.split(",")]
    root = args.root or tempfile.mkdtemp(prefix="cairn-group-sizes-")
    emulator, bucket, rows = None, None, []
    try:
        if "gcs" in wheres:
            emulator = start_emulator(args.emulator.split(",")[0].strip(), root)
            emulator.activate()
            bucket = emulator.create_bucket("group-sizes")
            env = emulator.environ(env)
            env["CAIRN_CACHE_HOME"] = os.path.join(root, "cairn-cache-home")
        for g in [int(x) for x in args.group_sizes.split(",")]:
            tag = f"_g{g}_x{args.scale}"
            seconds = build(root, n, args.shards, args.workers, g, args.scale, tag)
            if seconds is not None:
                print(f"built {n:,} records, group_size {g}: {seconds:.1f} s", flush=True)
            for where in wheres:
                if where == "gcs":
                    upload(root, n, bucket, tag)
                    path = store.task_dir(bucket_cache(bucket, n, tag), NAME, "train")
                else:
                    path = store.task_dir(paths(root, n, tag)[1], NAME, "train")
                row = measure_in_child(
                    [
                        sys.executable,
                        os.path.abspath(__file__),
                        "--measure_chunks",
                        path,
                        "--seconds",
                        str(args.seconds),
                    ],
                    env,
                    f"group_size {g} {where}",
                )
                rows.append(row)
    finally:
        if emulator is not None:
            emulator.stop()
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\n{n:,} records in {args.shards} shards, rows x{args.scale}; CachedTask alone, no LRU of chunks\n")
    print(
        "| group_size | storage | shards MB (bytes/record) | per open shard KB | whole chunks rows/s "
        "| single records rows/s (32 a call) | chunk fetches per 1,000 single rows | ms to open a shard |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['group_size']} | {r['where']} | {r['mb']:.1f} ({r['record_bytes']:.0f}) | {r['open_kb']:,.0f} "
            f"| {r['whole_rows_per_s']:,.0f} | {r['single_rows_per_s']:,.0f} | {r['fetches_per_1000']:,.0f} "
            f"| {r['open_s'] * 1000:.2f} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1e5,1e6,1e7", help="record counts, comma-separated")
    p.add_argument("--shards", type=int, default=1000)
    p.add_argument("--root", help="keep (and reuse) the synthetic caches in this directory")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="processes writing shards")
    p.add_argument("--modes", default="packed,unpacked")
    p.add_argument(
        "--storage",
        default="local",
        help="local and/or gcs (a fake-gcs-server bucket: the cache uploaded, read over HTTP)",
    )
    p.add_argument("--group_size", type=int, help="records per chunk of the caches (default: the writer's)")
    p.add_argument("--group_sizes", help="instead: rows/s and open-shard memory for these chunk sizes, e.g. 1,16,64")
    p.add_argument("--scale", type=int, default=1, help="--group_sizes: rows this many times longer")
    p.add_argument("--seconds", type=float, default=3.0, help="--group_sizes: seconds per rate")
    p.add_argument(
        "--steps",
        type=int,
        default=0,
        help="the growth table (issue 37): read this many steps for the steady rate and the RSS after them, "
        "and take the first batch at the last step of the first epoch instead of step 1,000,000",
    )
    p.add_argument(
        "--emulator",
        default="filesystem",
        help="the fake-gcs-server backends for --storage gcs, comma-separated (each measured): filesystem "
        "(objects on disk, under --root kept between runs; a listing costs it ~0.2 ms of CPU per object) or memory "
        "(an object found by scanning its bucket: ~4 ms of CPU a request at 10,000 shards)",
    )
    p.add_argument("--emulator_pid", type=int, help="internal: the emulator's process (its CPU time)")
    p.add_argument("--measure_chunks", help="internal: the cache measured in this process")
    p.add_argument("--measure", help="internal: SIZE,PACK measured in this process")
    p.add_argument("--cache_dir", help="internal: the cache to measure")
    args = p.parse_args()
    print(machine_line(), flush=True)
    sys.path[:0] = [os.path.join(REPO, lib) for lib in ("storage", "tokenizers", "datatasks")]
    if args.measure:
        n, pack = args.measure.split(",")
        tag = f"_g{args.group_size}" if args.group_size else ""
        where = (args.cache_dir, tag, args.steps, args.emulator_pid, args.emulator)
        row = measure(args.root, int(n), pack == "1", args.repeats, *where)
        json.dump(row, sys.stdout)
        return
    if args.measure_chunks:
        json.dump(measure_chunks(args.measure_chunks, args.seconds), sys.stdout)
        return
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    modes = [m.strip() for m in args.modes.split(",")]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(REPO, lib) for lib in ("storage", "tokenizers", "datatasks")] + [env.get("PYTHONPATH", "")]
    )
    if args.group_sizes:
        group_size_table(args, env)
        return
    root = args.root or tempfile.mkdtemp(prefix="cairn-reader-scale-")
    tag = f"_g{args.group_size}" if args.group_size else ""
    wheres = [w.strip() for w in args.storage.split(",")]
    kinds = [k.strip() for k in args.emulator.split(",")]
    rows = []

    def measure_rows(n: int, where: str, child_env: dict, extra: list) -> None:
        for mode in modes:
            extra = extra + (["--group_size", str(args.group_size)] if args.group_size else [])
            row = measure_in_child(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--root",
                    root,
                    "--repeats",
                    str(args.repeats),
                    "--measure",
                    f"{n},{int(mode == 'packed')}",
                    "--steps",
                    str(args.steps),
                ]
                + extra,
                child_env,
                f"{n} {mode} {where}",
            )
            rows.append(row)

    try:
        for n in sizes:
            seconds = build(root, n, args.shards, args.workers, args.group_size, tag=tag)
            if seconds is not None:
                print(
                    f"built {n:,} records in {args.shards} shards: {seconds:.1f} s ({n / seconds:,.0f} records/s)",
                    flush=True,
                )
            for where in wheres:
                if where != "gcs":
                    measure_rows(n, where, env, [])
                    continue
                for kind in kinds:  # a fresh emulator of each backend, the cache uploaded to it
                    emulator = start_emulator(kind, root)
                    try:
                        emulator.activate()
                        bucket = emulator.create_bucket("reader-scale")
                        print(f"uploaded {n:,} records to the {kind} emulator: {upload(root, n, bucket, tag):.1f} s")
                        child_env = dict(emulator.environ(env), CAIRN_CACHE_HOME=os.path.join(root, "cairn-cache-home"))
                        extra = ["--cache_dir", bucket_cache(bucket, n, tag), "--emulator_pid", str(emulator.pid)]
                        measure_rows(n, f"gcs ({kind})", child_env, extra + ["--emulator", kind])
                    finally:
                        emulator.stop()
    finally:
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)
    from cairn.datatasks.deterministic.cache_writer import DEFAULT_GROUP_SIZE

    print(
        f"\n{args.shards} shards, group_size {args.group_size or DEFAULT_GROUP_SIZE}; EncDec {LENGTHS}, "
        f"global batch {BATCH}; medians of {args.repeats}; emulators: {args.emulator}\n"
    )
    if args.steps:
        growth_table(rows, args.steps)
        return
    local = {(r["n"], r["pack"]): r["build_s"] for r in rows if r["where"] == "local"}
    print(
        "| records | storage | mode | bins | first construction s | later construction s (CPU s) | vs local | "
        "first batch step 0 s | "
        f"step {FAR_STEP:,} s (ratio) | rows/s | peak RSS MB (above imports) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mode = f"packed ({r['examples_per_row']:.1f}/row)" if r["pack"] else "unpacked"
        ref = local.get((r["n"], r["pack"]))
        ratio = f"{r['build_s'] / ref:.1f}x" if ref else "-"
        print(
            f"| {r['n']:,} | {r['where']} | {mode} | {r['bins']:,} | {r['first_build_s']:.2f} | {r['build_s']:.2f} "
            f"({r['build_cpu_s']:.2f}) | {ratio} | {r['first_0_s']:.3f} | {r['first_far_s']:.3f} "
            f"({r['first_far_s'] / r['first_0_s']:.2f}x) | {r['rows_per_s']:,.0f} "
            f"| {r['peak_rss_mb']:,.0f} ({r['peak_rss_mb'] - r['base_rss_mb']:+,.0f}) |"
        )


def growth_table(rows: list[dict], steps: int) -> None:
    """Issue 37's growth table: each row of the reader at one size, mode and storage."""
    local = {(r["n"], r["pack"]): r for r in rows if r["where"] == "local"}
    print(
        "| records | storage | mode | construction s (first) | first batch step 0 s | last step of epoch 0 s (ratio) "
        f"| rows/s over {steps:,} steps (vs local) | RSS after them MB (above imports) | of which anonymous above "
        "imports / mapped files MB | chunk fetches / shard opens per 1,000 rows | open shards "
        "| CPU s per 1,000 rows: reader / emulator | load at start / end |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mode = f"packed ({r['examples_per_row']:.1f}/row)" if r["pack"] else "unpacked"
        ref = local.get((r["n"], r["pack"]))
        vs = f" ({r['rows_per_s'] / ref['rows_per_s']:.2f}x)" if ref and r is not ref else ""
        print(
            f"| {r['n']:,} | {r['where']} | {mode} | {r['build_s']:.2f} ({r['first_build_s']:.2f}) "
            f"| {r['first_0_s']:.3f} | {r['first_far_s']:.3f} ({r['first_far_s'] / r['first_0_s']:.2f}x) "
            f"| {r['rows_per_s']:,.0f}{vs} | {r['rss_after_mb']:,.0f} ({r['rss_after_mb'] - r['base_rss_mb']:+,.0f}) "
            f"| {r.get('anon_above_imports_mb', float('nan')):+,.0f} / {r.get('file_rss_after_mb', float('nan')):,.0f} "
            f"| {r['fetches_per_1000_rows']:.1f} / {r['opens_per_1000_rows']:.2f} | {r['open_shards']:,} "
            f"| {r['reader_cpu_s_per_1000_rows']:.4f} / "
            + (f"{r['emulator_cpu_s_per_1000_rows']:.4f}" if r["where"].startswith("gcs") else "-")
            + f" | {r['load'][0]:.1f} / {r['load'][1]:.1f} |"
        )


if __name__ == "__main__":
    main()
