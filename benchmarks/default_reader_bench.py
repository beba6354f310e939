"""The default experiments' training reader: steady batches/s once the cache exists.

  .venv/bin/python benchmarks/default_reader_bench.py [--configs t5,lm] [--batches N]
      [--warmup N] [--repeats R] [--cache_dir DIR]

For each default experiment (`launchers/configs/shakespeare_t5_tiny.py`: span corruption,
EncDec packed, batch 32, inputs 64 / targets 16; `shakespeare_lm_tiny.py`: random crop, LM)
the task is cached first (in this process, as `train` does when the cache is missing; kept in
`--cache_dir` for the next run), then a fresh process opens the reader as the launcher does
(`cairn.launchers.data.make_train_data`'s `DeterministicReader`, its defaults: prefetch and
steps per pass) and `_reader_measure.measure` times `--repeats` windows of `--batches`
batches after `--warmup`. It reports the median batches/s, non-pad target tokens/s and
whether the reader's process imported TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from _machine import machine_line  # benchmarks/ is sys.path[0] when run as a script

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LIBS = ("storage", "tokenizers", "datatasks", "partitioning", "models", "evaluation", "trainer", "launchers")
CONFIGS = {
    "t5": os.path.join(REPO, "launchers", "configs", "shakespeare_t5_tiny.py"),
    "lm": os.path.join(REPO, "launchers", "configs", "shakespeare_lm_tiny.py"),
}


def _spec(config_path: str, cache_dir: str):
    from cairn.launchers import config_io, run_spec

    config = config_io.resolve_paths(config_io.load_config_file(config_path))
    config.data.cache_dir = cache_dir
    return run_spec.load(config)


def _tasks(spec):
    from cairn.launchers import data as data_lib

    data_lib.register_tasks(spec.keys, spec.vocabulary)
    return data_lib.get_tasks(spec.keys, "data.task")


def cache(config_path: str, cache_dir: str) -> None:
    """The experiment's task cached under `cache_dir` (nothing done when it is)."""
    from cairn.launchers import data as data_lib

    spec = _spec(config_path, cache_dir)
    data_lib.ensure_cached(spec.reader, _tasks(spec))


def child(config_path: str, cache_dir: str, batches: int, warmup: int, repeats: int) -> dict:
    """The reader alone in this (fresh) process, measured."""
    from _reader_measure import measure

    from cairn.launchers import data as data_lib

    spec = _spec(config_path, cache_dir)
    tasks = _tasks(spec)
    reader = spec.reader
    assert not data_lib.cache_missing(reader, tasks), "cache first"
    rows = data_lib.open_reader(reader)  # as `make_train_data` opens it, all rows, no prefetch bound
    cpu = time.process_time()
    try:
        got = measure(rows, batches, warmup, repeats, reader.sequence_length["targets"])
    finally:
        rows.close()  # joins the prefetch threads: their CPU is counted
    # The process's CPU (all threads) per 1,000 batches: steadier than batches/s on a shared machine.
    got["cpu_s_per_1k"] = (time.process_time() - cpu) * 1000 / (warmup + batches * repeats)
    got["tensorflow_imported"] = "tensorflow" in sys.modules
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="t5,lm")
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache_dir", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path[:0] = [os.path.join(REPO, lib) for lib in LIBS]
    cache_dir = args.cache_dir or os.path.join(tempfile.gettempdir(), "cairn_default_reader_bench")
    if args.child:
        print(json.dumps(child(CONFIGS[args.child], cache_dir, args.batches, args.warmup, args.repeats)))
        return
    print(machine_line())
    for name in args.configs.split(","):
        cache(CONFIGS[name], cache_dir)
        argv = [sys.executable, os.path.abspath(__file__), "--child", name, "--cache_dir", cache_dir]
        argv += ["--batches", str(args.batches), "--warmup", str(args.warmup), "--repeats", str(args.repeats)]
        run = subprocess.run(argv, capture_output=True, text=True, check=False)
        if run.returncode:
            raise SystemExit(f"{name}: the reader child failed:\n{run.stderr[-3000:]}")
        got = json.loads(run.stdout.strip().splitlines()[-1])
        rates = ", ".join(f"{r:.1f}" for r in got["rates"])
        print(
            f"{name}: {got['batches_per_s']:.1f} batches/s (windows {rates}), "
            f"{got['tokens_per_s']:,.0f} non-pad target tokens/s, fill {got['fill']:.3f}, "
            f"CPU {got['cpu_s_per_1k']:.3f} s per 1,000 batches, "
            f"TensorFlow imported: {got['tensorflow_imported']}"
        )


if __name__ == "__main__":
    main()
