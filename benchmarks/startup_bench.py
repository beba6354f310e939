"""Start-up cost of a Cairn process: how long a fresh interpreter takes to import what Cairn's
entry points import, and how long the train entry point takes to refuse a bad config (a user's
commonest first run). Each row is the median wall time of `--repeats` fresh interpreters.

The peer is `import jax`: the least any JAX program pays before doing anything. A row's ratio is
its median over the peer's median, so a slower machine moves both. The library rows (numpy,
ml_dtypes, TensorFlow) show where a regression comes from: ml_dtypes 0.7.0 took 0.9 s to import
here (0.6.0: 0.01 s), which every process of the test suite paid twice over (JAX and
TensorFlow both import it), so requirements.lock pins 0.6.0.

    .venv/bin/python benchmarks/startup_bench.py                # 7 repeats, ~2 min
    .venv/bin/python benchmarks/startup_bench.py --repeats 3    # quick
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
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


def _env() -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(str(REPO / lib) for lib in LIBRARIES)
    return env


def time_row(argv: list[str], status: int, repeats: int) -> float:
    """Median seconds of `repeats` fresh `python <argv>` runs (one untimed run first: the file
    cache); raises if a run ends with another status."""
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, *argv], env=_env(), cwd=str(REPO), capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        if proc.returncode != status:
            raise SystemExit(f"{argv}: exit {proc.returncode}, expected {status}\n{proc.stderr[-2000:]}")
        if i:
            times.append(elapsed)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="fresh interpreters per row (median)")
    args = parser.parse_args(argv)
    medians = {name: time_row(cmd, status, args.repeats) for name, (cmd, status) in ROWS.items()}
    peer = medians[PEER]
    print(f"{'process':<36} {'median s':>9} {'/ import jax':>13}")
    for name, seconds in medians.items():
        print(f"{name:<36} {seconds:>9.2f} {seconds / peer:>12.2f}x")
    print(f"({args.repeats} runs per row; Python {sys.version.split()[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
