"""Storage that stutters: reading a task cache and training with model_dir and cache in a bucket,
through a fault-injecting proxy (`cairn.storage.fault_proxy`) in front of the GCS emulator, at
1-10 % of requests faulted, against the same proxy injecting nothing (the peer, in the same run).

A faulted request gets, uniformly, a 429, a 503 (both without reaching the emulator), a connection
reset mid-body (a GET's answer cut half-way; an upload dropped before it is forwarded) or a delay
of `--delay` seconds; which requests fault follows a seeded RNG (`--seed`). Every client retries
under the one retry budget (`CAIRN_STORAGE_RETRY_S`, default 300 s: nothing here gives up).

Rows:
  * reading: `--records` records of the default experiment's cached train split, in a seeded
    random order, `--window` a call, by a fresh `CachedTask` keeping no decoded chunk (every call
    is ranged GETs on the direct path; its metadata by gcsfs); rows/s, the median of `--repeats`;
  * training: the default experiment (tiny T5, 1 process x 8 CPU devices) for `--steps` steps,
    a checkpoint every `--checkpoint_every` (orbax through tensorstore), model_dir and cache in
    the bucket; the medians of `sequences_per_second` (rows/s) and `step_time_s` over the logged
    steps after `--warmup` (read from the run's metrics.jsonl) and the run's wall time (start-up
    and compilation included: a warm JAX compilation cache shared by the runs);
each with its ratio to the row without faults, and the faults the proxy served during it.

    .venv/bin/python benchmarks/storage_faults_bench.py                      # 0,1,2,5,10 %; ~6 min
    .venv/bin/python benchmarks/storage_faults_bench.py --rates 0,0.05 --steps 20  # quick
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from _machine import machine_line  # benchmarks/ is sys.path[0] when run as a script

REPO = pathlib.Path(__file__).absolute().parent.parent
LIBS = ("storage", "tokenizers", "datatasks", "partitioning", "models", "evaluation", "trainer", "launchers")
for _lib in LIBS:
    sys.path.insert(0, str(REPO / _lib))
CONFIG = REPO / "launchers" / "configs" / "shakespeare_t5_tiny.py"
TASK = "shakespeare_span_corruption"
KINDS = ("429", "503", "reset", "delay")


def child_env(base: dict, compile_cache: pathlib.Path) -> dict:
    env = dict(
        base,
        JAX_PLATFORMS="cpu",
        TF_CPP_MIN_LOG_LEVEL="3",
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
        JAX_COMPILATION_CACHE_DIR=str(compile_cache),
        PYTHONPATH=os.pathsep.join(str(REPO / lib) for lib in LIBS),
    )
    env.pop("BUILD_WORKING_DIRECTORY", None)
    return env


def train_args(model_dir: str, cache_dir: str, steps: int, checkpoint_every: int) -> list[str]:
    return [
        f"--config={CONFIG}",
        f"--config.model_dir={model_dir}",
        f"--config.data.cache_dir={cache_dir}",
        f"--config.num_train_steps={steps}",
        "--config.trainer.log_every=1",
        f"--config.trainer.checkpoint_every={checkpoint_every}",
        "--config.trainer.keep_checkpoints=2",
        "--config.trainer.eval_every=0",
        "--config.trainer.tensorboard=False",
        "--config.fingerprint_every=0",
        "--config.post_training.final_eval=False",
        "--config.post_training.num_samples=0",
    ]


def train(args: list[str], env: dict, log: pathlib.Path) -> float:
    """One training run (a child process); its wall seconds. Raises with the log's tail if it fails."""
    start = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.call(
            [sys.executable, "-m", "cairn.launchers.train_main", *args], env=env, cwd=REPO, stdout=out, stderr=out
        )
    if code != 0:
        raise RuntimeError(f"training exited {code}; {log}:\n{log.read_text(errors='replace')[-3000:]}")
    return time.perf_counter() - start


def train_metric(model_dir: str, metric: str, warmup: int) -> list[float]:
    """`metric` (`step_time_s`, `sequences_per_second`) of the logged train steps after `warmup`
    (metrics.jsonl, in the bucket)."""
    from cairn import storage

    rows, _ = storage.read_json_lines(storage.join(model_dir, "summaries", "metrics.jsonl"))
    return [
        float(r["value"])
        for r in rows
        if r.get("task") == "train" and r.get("metric") == metric and int(r["step"]) > warmup
    ]


def read_rate(cache_dir: str, window: int, records: int, repeats: int, seed: int) -> tuple[float, int]:
    """(rows/s, rows) of reading `records` records of the cached train split from `cache_dir` in a
    seeded random order, `window` records a call, by a fresh reader keeping no decoded chunk (so
    every call is ranged GETs: the access pattern of a shuffled reader)."""
    import numpy as np

    from cairn.datatasks.deterministic import task_dir
    from cairn.datatasks.deterministic.cached_task import CachedTask

    times, count = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        task = CachedTask(task_dir(cache_dir, TASK, "train"), chunk_cache_bytes=0)
        order = np.random.default_rng(seed).permutation(task.num_records)[:records]
        count = len(order)
        for first in range(0, count, window):
            task.read(sorted(int(i) for i in order[first : first + window]))
        times.append(time.perf_counter() - start)
    return count / statistics.median(times), count


def served(after: dict, before: dict) -> str:
    got = {k: after[k] - before[k] for k in ("requests", *KINDS)}
    return f"{got['requests']:,} requests: " + " / ".join(str(got[k]) for k in KINDS)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="0,0.01,0.02,0.05,0.1", help="fractions of requests faulted; 0 first")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3, help="logged steps left out of the step-time median")
    p.add_argument("--checkpoint_every", type=int, default=10)
    p.add_argument("--window", type=int, default=16, help="records per read call")
    p.add_argument("--records", type=int, default=2000, help="records read (in a seeded random order)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--delay", type=float, default=1.0, help="seconds a delayed response waits")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    if rates[0] != 0.0:
        p.error("--rates must start with 0 (the row without faults every ratio is to)")

    from cairn import storage
    from cairn.storage.fault_proxy import FaultProxy
    from cairn.storage.testing import GcsEmulator

    print(machine_line(), flush=True)
    with tempfile.TemporaryDirectory(prefix="cairn-stutter-bench-") as tmp_name:
        tmp = pathlib.Path(tmp_name)
        local_cache = tmp / "cache"
        compile_cache = tmp / "jax-cache"
        env = child_env(dict(os.environ), compile_cache)
        # the task cached on local disk (and the step compiled into the cache) by a clean local run
        train(train_args(str(tmp / "warm"), str(local_cache), args.warmup + 2, 1000), env, tmp / "warm.log")
        with GcsEmulator(root=tmp / "gcs") as emu, FaultProxy(emu.url, seed=args.seed, delay_s=args.delay) as proxy:
            proxy.activate()
            bucket = emu.create_bucket("stutter-bench")
            for f in sorted(local_cache.rglob("*")):
                if f.is_file():
                    storage.copy_file(str(f), f"{bucket}/cache/{f.relative_to(local_cache)}")
            child = proxy.environ(env)
            print(
                f"faults: 429 / 503 / reset mid-body / {args.delay:g} s delay, uniformly, seed {args.seed}; "
                f"reads: median of {args.repeats}, {args.records} records in random order, {args.window} a call; "
                f"training: {args.steps} steps, "
                f"a checkpoint every {args.checkpoint_every}, median step time after step {args.warmup}",
                flush=True,
            )
            print("| faults | read rows/s | / clean | faults served while reading (429 / 503 / reset / delay) |")
            print("|---|---|---|---|")
            clean = None
            for rate in rates:
                proxy.set_rate(rate)
                before = proxy.counts()
                rows, _ = read_rate(f"{bucket}/cache", args.window, args.records, args.repeats, args.seed)
                clean = clean or rows
                print(
                    f"| {rate:.0%} | {rows:,.0f} | {rows / clean:.2f} | {served(proxy.counts(), before)} |", flush=True
                )
            print()
            print(
                "| faults | rows/s | step time s | / clean | run wall s | / clean "
                "| faults served (429 / 503 / reset / delay) |"
            )
            print("|---|---|---|---|---|---|---|")
            clean_step = clean_wall = None
            for i, rate in enumerate(rates):
                proxy.set_rate(rate)
                before = proxy.counts()
                run = f"{bucket}/runs/{i}"
                wall = train(
                    train_args(run, f"{bucket}/cache", args.steps, args.checkpoint_every), child, tmp / f"{i}.log"
                )
                proxy.set_rate(0.0)
                after = proxy.counts()
                step = statistics.median(train_metric(run, "step_time_s", args.warmup))
                seqs = statistics.median(train_metric(run, "sequences_per_second", args.warmup))
                clean_step, clean_wall = clean_step or step, clean_wall or wall
                print(
                    f"| {rate:.0%} | {seqs:.1f} | {step:.3f} | {step / clean_step:.2f} | {wall:.1f} | "
                    f"{wall / clean_wall:.2f} | "
                    f"{served(after, before)} |",
                    flush=True,
                )
            print(json.dumps({"load_after": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
