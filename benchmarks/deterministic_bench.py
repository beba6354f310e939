"""Deterministic pipelines of cairn.datatasks: cache job, resume cost and throughput.

  .venv/bin/python benchmarks/deterministic_bench.py [--lines N] [--files F] [--batches N]
      [--unpacked-batches N] [--repeats R] [--no-grain]

The task is datatasks_bench.py's: the `shakespeare` package's non-empty lines (the first
`--lines`, split into `--files` text files), `inputs` / `targets` = the two halves of each
line's words, the shared 8,000-piece SentencePiece vocabulary (+100 sentinels),
`tokenize` (cached) and `append_eos_after_trim` (after the cache), EncDecFeatureConverter
with lengths inputs 512 / targets 128, global batch 32. It reports:

  * the cache job (`cache_tasks` on Apache Beam, DirectRunner, 2 worker processes): records/s;
  * time to the first batch of a fresh reader (no prefetch, one step per call) at step 0
    and at step 1,000,000, the latter reached with `set_state` (no iteration), packed and
    unpacked, and their ratio (median of 3 fresh readers each, after one warm-up round);
  * steady-state batches/s of the deterministic reader (default prefetch), of the streaming
    `cairn.datatasks.get_dataset` (shuffle buffer, seeded) and of seqio 0.0.20's streaming
    `get_dataset` (run in `.peer-venv` by this same file with `--peer`), as ratios;
  * each reader alone in a fresh process, measured by the same code (`_reader_measure.py`):
    Cairn's deterministic reader (this file with `--reader-child`) and Grain 0.2.18 reading
    the same cached ArrayRecord shards (`_grain_peer.py` in `.peer-venv`: unpacked with 0
    workers, packed with 2 and 0 worker processes): batches/s, non-pad target tokens/s,
    target fill, peak RSS, and Cairn/Grain per non-pad target token and in peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _machine import machine_line  # benchmarks/ is sys.path[0] when run as a script

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PEER_PYTHON = os.path.join(REPO, ".peer-venv", "bin", "python")
LIB_PATHS = [os.path.join(REPO, lib) for lib in ("storage", "tokenizers", "datatasks")]
LENGTHS = {"inputs": 512, "targets": 128}
BATCH = 32
FAR_STEP = 1_000_000
TASKS_MODULE = """
import os, sys
sys.path[:0] = {paths!r}
import cairn.datatasks as dt
from cairn.datatasks import preprocessors as pp
from cairn.tokenizers import SentencePieceVocabulary
from datatasks_bench import halves
vocab = SentencePieceVocabulary({model!r}, extra_ids=100)
feats = {{"inputs": dt.Feature(vocab), "targets": dt.Feature(vocab)}}
if "det_bench" not in dt.DEFAULT_REGISTRY:
    dt.TaskRegistry.add("det_bench", dt.TextLineDataSource({{"train": {data!r}}}), feats,
                        [halves, pp.tokenize, pp.append_eos_after_trim])
"""


def peer_rates(model: str, data: str, batches: dict, warmup: int) -> dict:
    """seqio's streaming pipeline (run in the peer venv)."""
    import seqio

    sys.path.insert(0, HERE)
    from datatasks_bench import halves

    vocab = seqio.SentencePieceVocabulary(model, extra_ids=100)
    out = {}
    for pack in (True, False):
        name = f"det_bench_{int(pack)}"
        seqio.TaskRegistry.add(
            name,
            source=seqio.TextLineDataSource({"train": data}),
            preprocessors=[halves, seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
            output_features={"inputs": seqio.Feature(vocab), "targets": seqio.Feature(vocab)},
        )
        ds = seqio.get_dataset(
            name,
            LENGTHS,
            seqio.EncDecFeatureConverter(pack=pack),
            dataset_split="train",
            shuffle=True,
            num_epochs=None,
            batch_size=BATCH,
            seed=0,
        )
        out["packed" if pack else "unpacked"] = rate(ds.as_numpy_iterator(), batches[pack], warmup)
    return out


def rate(it, batches: int, warmup: int) -> float:
    for _ in range(warmup):
        next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    return batches / (time.perf_counter() - start)


def cache_job(root: str, model: str, lines: list, files: int) -> tuple[float, int]:
    """Runs `cache_tasks` on Beam (2 workers); returns (seconds, records)."""
    from cairn.datatasks.deterministic import cache_tasks

    data_dir = os.path.join(root, "data")
    os.makedirs(data_dir)
    for i in range(files):
        with open(os.path.join(data_dir, f"part-{i:03d}.txt"), "w", encoding="utf-8") as f:
            f.write("".join(line.replace("\r", " ") + "\n" for line in lines[i::files]))
    paths = LIB_PATHS + [HERE]
    with open(os.path.join(root, "det_bench_tasks.py"), "w", encoding="utf-8") as f:
        f.write(TASKS_MODULE.format(paths=paths, model=model, data=os.path.join(data_dir, "*.txt")))
    sys.path.insert(0, root)
    os.environ["PYTHONPATH"] = os.pathsep.join([root] + paths + [os.environ.get("PYTHONPATH", "")])
    start = time.perf_counter()
    cache_tasks("det_bench", os.path.join(root, "cache"), module_import=["det_bench_tasks"])
    seconds = time.perf_counter() - start
    from cairn.datatasks.deterministic import CachedTask, task_dir

    n = CachedTask(task_dir(os.path.join(root, "cache"), "det_bench", "train")).num_records
    return seconds, n


def reader_figures(root: str, batches: dict, warmup: int) -> dict:
    import cairn.datatasks as dt
    from cairn.datatasks.deterministic import DeterministicReader

    out = {}
    for pack in (True, False):

        def make(pack=pack, **kwargs):
            start = time.perf_counter()
            r = DeterministicReader(
                "det_bench",
                os.path.join(root, "cache"),
                seed=0,
                global_batch_size=BATCH,
                sequence_length=LENGTHS,
                feature_converter=dt.EncDecFeatureConverter(pack=pack),
                **kwargs,
            )
            return r, time.perf_counter() - start

        firsts: dict = {0: [], FAR_STEP: []}
        for step in (0, FAR_STEP) * 4:  # the first round is dropped: one-off warm-up
            reader, build = make(prefetch=0, steps_per_call=1)
            start = time.perf_counter()
            reader.set_state({**reader.get_state(), "step": step})  # the rest of the state: the read order
            next(reader)
            firsts[step].append(time.perf_counter() - start)
        firsts = {k: statistics.median(v[1:]) for k, v in firsts.items()}
        reader, _ = make()
        det = rate(reader, batches[pack], warmup)
        ds = dt.get_dataset(
            "det_bench",
            LENGTHS,
            dt.EncDecFeatureConverter(pack=pack),
            shuffle=True,
            num_epochs=None,
            seed=0,
            batch_size=BATCH,
        )
        stream = rate(ds.as_numpy_iterator(), batches[pack], warmup)
        out["packed" if pack else "unpacked"] = {
            "build_s": build,
            "first_0_s": firsts[0],
            "first_far_s": firsts[FAR_STEP],
            "deterministic": det,
            "streaming": stream,
        }
    return out


def reader_child(root: str, mode: str, batches: int, warmup: int, repeats: int) -> dict:
    """Cairn's deterministic reader (default prefetch) alone in this process, measured with
    the same code as the Grain peer (`_reader_measure`): rates, fill and peak RSS."""
    sys.path[:0] = [root] + LIB_PATHS + [HERE]
    import det_bench_tasks  # noqa: F401  (registers the task)
    from _reader_measure import TreeRss, max_rss_mb, measure, rss_report

    import cairn.datatasks as dt
    from cairn.datatasks.deterministic import DeterministicReader

    base = max_rss_mb()
    sampler = TreeRss()
    reader = DeterministicReader(
        "det_bench",
        os.path.join(root, "cache"),
        seed=0,
        global_batch_size=BATCH,
        sequence_length=LENGTHS,
        feature_converter=dt.EncDecFeatureConverter(pack=mode == "packed"),
    )
    out = measure(reader, batches, warmup, repeats, LENGTHS["targets"])
    tree = sampler.stop()
    reader.close()
    out.update(rss_report(base, tree))
    return out


def child_json(argv: list, what: str) -> dict:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode:
        return {"error": f"{what} failed: " + proc.stderr[-800:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def side_rows(mode: str, name: str, f: dict, workers: int = 0) -> list:
    if "error" in f:
        return [(mode, f"{name}: {f['error'][-300:]}", "")]
    rows = [
        (mode, f"{name} batches/s", f"{f['batches_per_s']:.1f}"),
        (mode, "  non-pad target tokens/s", f"{f['tokens_per_s']:,.0f}"),
        (mode, "  target fill (of batch x 128)", f"{f['fill']:.3f}"),
        (mode, "  peak RSS MB (after imports)", f"{f['rss_self_mb']:,.0f} ({f['rss_imports_mb']:,.0f})"),
    ]
    if workers:  # sampled sum over the process tree (ru_maxrss of children is per child)
        rows.append((mode, "  peak RSS MB, with workers", f"{f['rss_tree_peak_mb']:,.0f}"))
    return rows


def token_rows(cairn: dict, grain: dict) -> list:
    """Rows (mode, metric, text): Cairn's reader and Grain, each in its own process, and
    Cairn/Grain per non-pad target token (targets: >= 3 unpacked, >= 2.5 packed vs 2
    workers) and in peak RSS (<= Grain's 0-worker process)."""
    rows = []
    for mode, c in cairn.items():
        rows += side_rows(mode, "cairn reader, own process", c)
        for g_mode, g in grain.items():
            if not g_mode.startswith(mode):
                continue
            workers = 0 if g_mode == "unpacked" else int(g_mode.removeprefix("packed_mp"))
            rows += side_rows(mode, f"grain 0.2.18, {workers} workers", g, workers)
            if "error" in c or "error" in g:
                continue
            target = {"unpacked": " (>= 3)", "packed_mp2": " (>= 2.5)"}.get(g_mode, "")
            rows.append((mode, f"  cairn/grain per token{target}", f"{c['tokens_per_s'] / g['tokens_per_s']:.2f}"))
            if workers == 0:
                rows.append((mode, "  cairn/grain peak RSS (<= 1)", f"{c['rss_self_mb'] / g['rss_self_mb']:.2f}"))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lines", type=int, default=100_000)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--batches", type=int, default=200, help="packed batches timed")
    p.add_argument(
        "--unpacked-batches",
        type=int,
        default=2000,
        help="unpacked batches timed (many: the reader computes ~1,024 rows ahead)",
    )
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument(
        "--repeats", type=int, default=3, help="timed windows of the per-process reader and Grain measurements (median)"
    )
    p.add_argument("--no-grain", action="store_true", help="skip the Grain peer")
    p.add_argument("--peer", action="store_true", help="internal: run seqio's side")
    p.add_argument(
        "--reader-child", choices=("packed", "unpacked"), help="internal: measure Cairn's reader alone in this process"
    )
    p.add_argument("--root", help="internal: the benchmark's temporary directory")
    p.add_argument("--model")
    p.add_argument("--data")
    p.add_argument(
        "--cache-dir",
        default=os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "cairn-benchmarks"),
    )
    args = p.parse_args()
    print(machine_line(), flush=True)
    if args.peer:
        json.dump(
            peer_rates(args.model, args.data, {True: args.batches, False: args.unpacked_batches}, args.warmup),
            sys.stdout,
        )
        return
    counts = {"packed": args.batches, "unpacked": args.unpacked_batches}
    if args.reader_child:
        json.dump(
            reader_child(args.root, args.reader_child, counts[args.reader_child], args.warmup, args.repeats), sys.stdout
        )
        return
    sys.path[:0] = LIB_PATHS + [HERE]
    from tokenizers_bench import shakespeare_lines, trained_model

    lines = shakespeare_lines()[: args.lines]
    model, _ = trained_model(shakespeare_lines(), args.cache_dir, False)
    with tempfile.TemporaryDirectory() as root:
        seconds, records = cache_job(root, model, lines, args.files)
        print(f"{len(lines):,} lines in {args.files} files; vocab 8000 + 100; lengths {LENGTHS}; global batch {BATCH}")
        print(
            f"cache job (Beam DirectRunner, 2 workers): {records:,} records in "
            f"{seconds:.1f} s = {records / seconds:,.0f} records/s (incl. start-up)"
        )
        figures = reader_figures(root, {True: args.batches, False: args.unpacked_batches}, args.warmup)
        peer = "no .peer-venv (bash benchmarks/setup_peers.sh)"
        if os.path.exists(PEER_PYTHON):
            proc = subprocess.run(
                [
                    PEER_PYTHON,
                    os.path.abspath(__file__),
                    "--peer",
                    "--model",
                    model,
                    "--data",
                    os.path.join(root, "data", "*.txt"),
                    "--batches",
                    str(args.batches),
                    "--unpacked-batches",
                    str(args.unpacked_batches),
                    "--warmup",
                    str(args.warmup),
                ],
                capture_output=True,
                text=True,
            )
            peer = (
                json.loads(proc.stdout.strip().splitlines()[-1])
                if proc.returncode == 0
                else "seqio failed: " + proc.stderr[-500:]
            )
        common = [
            "--batches",
            str(args.batches),
            "--unpacked-batches",
            str(args.unpacked_batches),
            "--warmup",
            str(args.warmup),
            "--repeats",
            str(args.repeats),
        ]
        cairn = {
            mode: child_json(
                [sys.executable, os.path.abspath(__file__), "--reader-child", mode, "--root", root, *common],
                "cairn reader",
            )
            for mode in ("unpacked", "packed")
        }
        grain = {}
        if os.path.exists(PEER_PYTHON) and not args.no_grain:
            from cairn.datatasks.deterministic import task_dir
            from cairn.tokenizers import SentencePieceVocabulary

            grain = child_json(
                [
                    PEER_PYTHON,
                    os.path.join(HERE, "_grain_peer.py"),
                    "--task-dir",
                    task_dir(os.path.join(root, "cache"), "det_bench", "train"),
                    "--inputs-len",
                    str(LENGTHS["inputs"]),
                    "--targets-len",
                    str(LENGTHS["targets"]),
                    "--batch",
                    str(BATCH),
                    "--eos-id",
                    str(SentencePieceVocabulary(model).eos_id),
                    *common,
                ],
                "grain",
            )
    print(f"{'mode':10s}{'metric':34s}{'value':>12s}")
    for mode, f in figures.items():
        print(f"{mode:10s}{'reader build (plan) s':34s}{f['build_s']:12.3f}")
        print(f"{mode:10s}{'first batch at step 0 s':34s}{f['first_0_s']:12.3f}")
        print(f"{mode:10s}{f'first batch at step {FAR_STEP:,} s':34s}{f['first_far_s']:12.3f}")
        print(f"{mode:10s}{'  ratio far/0 (<= 1.5)':34s}{f['first_far_s'] / f['first_0_s']:12.2f}")
        print(f"{mode:10s}{'deterministic batches/s':34s}{f['deterministic']:12.1f}")
        print(f"{mode:10s}{'streaming get_dataset batches/s':34s}{f['streaming']:12.1f}")
        print(f"{mode:10s}{'  ratio det/streaming (>= 0.8)':34s}{f['deterministic'] / f['streaming']:12.2f}")
        if isinstance(peer, dict):
            print(f"{mode:10s}{'seqio 0.0.20 streaming batches/s':34s}{peer[mode]:12.1f}")
            print(f"{mode:10s}{'  ratio det/seqio':34s}{f['deterministic'] / peer[mode]:12.2f}")
    if not isinstance(peer, dict):
        print(f"seqio: {peer}")
    if "error" in grain:
        print(grain["error"])
        grain = {}
    print(
        f"\nEach reader alone in a fresh process (median of {args.repeats} windows of "
        f"{args.batches} packed / {args.unpacked_batches} unpacked batches):"
    )
    for mode, metric, text in token_rows(cairn, grain):
        print(f"{mode:10s}{metric:38s}{text:>14s}")


if __name__ == "__main__":
    main()
