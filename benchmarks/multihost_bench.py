"""Multi-process training on this CPU: 1x8, 2x4 and 4x2 processes x devices, tiny and small T5.

Each layout runs the train entry point (`python -m cairn.launchers.train_main`, what
`bazel run //launchers:train` runs) as N processes on 127.0.0.1 (`--config.multihost.*`), each
with `XLA_FLAGS=--xla_force_host_platform_device_count=D`, on the default experiment
(`launchers/configs/shakespeare_t5_tiny.py`) and on the same task with the `t5_1_1_small`
preset. It prints, per config and layout: the median step time over the logged steps after
warm-up and the median tokens/s (from `<model_dir>/summaries/metrics.jsonl`: `step_time_s`,
`tokens_per_second`), the median time a checkpoint save blocks the loop (process 0's log lines
"checkpoint at step N (blocked the loop X s)", the final save left out), that time as % of a
step, the slowest such save, and the step time's ratio to 1x8. Targets on the 2-core machine: 2x4 and 4x2 within 1.3x
of 1x8; a save blocks less than 5 % of a step at every layout.

    .venv/bin/python benchmarks/multihost_bench.py [--steps 30] [--configs tiny,small] \\
        [--layouts 1x8,2x4,4x2] [--rounds 1] [--checkpoint_every 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _machine import machine_line  # benchmarks/ is sys.path[0] when run as a script

REPO = Path(__file__).resolve().parents[1]
LIBS = ("tokenizers", "datatasks", "partitioning", "models", "evaluation", "trainer", "launchers")
CONFIG = REPO / "launchers" / "configs" / "shakespeare_t5_tiny.py"
# name -> overrides on top of the default experiment (inputs 64 / targets 16 tokens)
CONFIGS = {
    "tiny": [],
    "small": ["--config.model.preset=t5_1_1_small", "--config.data.batch_size=16"],
}
SAVE_LINE = re.compile(r"checkpoint at step (\d+) \(blocked the loop ([0-9.]+)s\)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(devices: int) -> dict:
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        TF_CPP_MIN_LOG_LEVEL="3",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
    )
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / lib) for lib in LIBS] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env.pop("BUILD_WORKING_DIRECTORY", None)
    return env


def run_layout(name: str, processes: int, devices: int, args: argparse.Namespace, work: Path) -> dict:
    """One training run as `processes` x `devices`; returns its measurements."""
    model_dir = work / f"{name}-{processes}x{devices}-{time.monotonic_ns()}"
    common = [
        f"--config={CONFIG}",
        f"--config.model_dir={model_dir}",
        f"--config.num_train_steps={args.steps}",
        "--config.trainer.log_every=1",
        f"--config.trainer.checkpoint_every={args.checkpoint_every}",
        "--config.trainer.keep_checkpoints=2",
        "--config.trainer.eval_every=0",
        "--config.trainer.tensorboard=False",
        "--config.fingerprint_every=0",
        "--config.post_training.final_eval=False",
        "--config.post_training.num_samples=0",
        *CONFIGS[name],
    ]
    if args.cache_dir:
        common.append(f"--config.data.cache_dir={args.cache_dir}")
    address = f"127.0.0.1:{free_port()}"
    logs = [work / f"{model_dir.name}-p{i}.log" for i in range(processes)]
    procs = []
    start = time.perf_counter()
    try:
        for i in range(processes):
            extra = (
                []
                if processes == 1
                else [
                    f"--config.multihost.coordinator_address={address}",
                    f"--config.multihost.num_processes={processes}",
                    f"--config.multihost.process_id={i}",
                ]
            )
            with open(logs[i], "w") as out:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "cairn.launchers.train_main", *common, *extra],
                        env=child_env(devices),
                        cwd=REPO,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + args.timeout
        for p, log in zip(procs, logs):
            code = p.wait(timeout=max(1.0, deadline - time.monotonic()))
            if code != 0:
                raise RuntimeError(
                    f"{name} {processes}x{devices}: process exited {code}; log {log}:\n"
                    f"{log.read_text(errors='replace')[-3000:]}"
                )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{name} {processes}x{devices}: over --timeout {args.timeout}s; logs {logs}") from None
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    wall = time.perf_counter() - start
    steps = metric_by_step(model_dir, "step_time_s")
    tokens = metric_by_step(model_dir, "tokens_per_second")
    kept = [s for s in steps if s > args.warmup]
    if not kept:
        raise RuntimeError(f"{name} {processes}x{devices}: no step_time_s after step {args.warmup} in {model_dir}")
    saves = [blocked for step, blocked in save_lines(logs[0]) if step < args.steps]
    step_time = statistics.median(steps[s] for s in kept)
    save = statistics.median(saves) if saves else float("nan")
    worst = max(saves) if saves else float("nan")
    return {
        "config": name,
        "layout": f"{processes}x{devices}",
        "step_time_s": step_time,
        "tokens_per_s": statistics.median(tokens[s] for s in kept if s in tokens),
        "save_blocked_s": save,
        "save_max_s": worst,
        "save_pct": 100.0 * save / step_time,
        "saves": len(saves),
        "steps_timed": len(kept),
        "wall_s": wall,
        "load": os.getloadavg()[0],
    }


def metric_by_step(model_dir: Path, metric: str) -> dict:
    """`{step: value}` of a train metric (the median where several processes logged a step;
    unreadable lines are skipped)."""
    values: dict = {}
    path = model_dir / "summaries" / "metrics.jsonl"
    for line in path.read_text(errors="replace").splitlines() if path.exists() else ():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("task") == "train" and row.get("metric") == metric:
            values.setdefault(int(row["step"]), []).append(float(row["value"]))
    return {s: statistics.median(v) for s, v in sorted(values.items())}


def save_lines(log: Path) -> list:
    """`(step, seconds)` of each "checkpoint at step N (blocked the loop X s)" line."""
    return [(int(m.group(1)), float(m.group(2))) for m in SAVE_LINE.finditer(log.read_text(errors="replace"))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="training steps per run")
    ap.add_argument("--warmup", type=int, default=3, help="logged steps left out of the medians")
    ap.add_argument("--checkpoint_every", type=int, default=5)
    ap.add_argument("--configs", default="tiny,small", help=f"of {', '.join(CONFIGS)}")
    ap.add_argument("--layouts", default="1x8,2x4,4x2", help="processes x devices; the first is the reference")
    ap.add_argument("--rounds", type=int, default=1, help="runs per layout (interleaved; the fastest is kept)")
    ap.add_argument("--cache_dir", default="", help="task cache (default: the config's, ~/.cache/cairn/tasks)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run before its processes are killed")
    ap.add_argument("--keep", action="store_true", help="keep the run directories and logs (printed)")
    args = ap.parse_args()
    print(machine_line(), flush=True)
    layouts = [tuple(int(n) for n in spec.split("x")) for spec in args.layouts.split(",")]
    names = args.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or args.steps <= args.warmup + 1:
        ap.error(f"unknown configs {unknown}" if unknown else "--steps must exceed --warmup + 1")
    work = Path(tempfile.mkdtemp(prefix="cairn-multihost-bench-"))
    print(
        f"{os.cpu_count()} CPU cores, load {os.getloadavg()[0]:.1f}; {args.steps} steps per run, "
        f"a save every {args.checkpoint_every}; runs in {work}",
        flush=True,
    )
    results = []
    try:
        for name in names:
            best: dict = {}
            for r in range(args.rounds):
                for processes, devices in layouts:
                    res = run_layout(name, processes, devices, args, work)
                    print(
                        f"  {name} {res['layout']} round {r}: step {res['step_time_s']:.3f}s, "
                        f"{res['tokens_per_s']:.0f} tokens/s, save blocks {res['save_blocked_s']:.3f}s "
                        f"(max {res['save_max_s']:.3f}s, {res['saves']} saves), {res['wall_s']:.0f}s wall, "
                        f"load {res['load']:.1f}",
                        flush=True,
                    )
                    if res["layout"] not in best or res["step_time_s"] < best[res["layout"]]["step_time_s"]:
                        best[res["layout"]] = res
            ref = best[f"{layouts[0][0]}x{layouts[0][1]}"]["step_time_s"]
            for res in best.values():
                res["vs_ref"] = res["step_time_s"] / ref
                results.append(res)
    finally:
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    ref_name = f"{layouts[0][0]}x{layouts[0][1]}"
    print(
        "\n| config | layout | step time (s) | tokens/s | save blocks (s) | save / step | slowest save (s) | "
        f"step time vs {ref_name} |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['config']} | {r['layout']} | {r['step_time_s']:.3f} | {r['tokens_per_s']:.0f} | "
            f"{r['save_blocked_s']:.3f} | {r['save_pct']:.1f} % | {r['save_max_s']:.3f} | {r['vs_ref']:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
