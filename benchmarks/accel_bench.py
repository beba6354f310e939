"""Accelerator benchmark: training MFU and decoding against the HBM roofline, every row of issue
39's table in one invocation (one TPU v5e chip: 197 TFLOP/s bf16, 819 GB/s, 15.75 GiB).

| row | what | target |
|---|---|---|
| llama_bf16 | llama_1b, bf16 params, Adafactor, 2048 tokens, the largest batch that fits | MFU >= 55 %, batch >= 8 |
| llama_f32 | llama_1b, float32 params, AdamW, optimizer state offloaded to the host | trains; MFU >= 45 % |
| t5_large | T5.1.1-large, Adafactor, inputs 512 / targets 114 | MFU >= 50 % |
| t5_xl | T5.1.1-XL, Adafactor, 512/114 (bf16 params when float32 does not fit) | trains; MFU reported |
| decode_b1 | llama_1b greedy decoding, batch 1, prompt 128 + 128 new tokens | >= 90 % of the roofline |
| decode_b32 | the same at batch 32 (weights + KV cache) | >= 80 % of the roofline |

Training rows run through `cairn.trainer.Trainer` on seeded synthetic tokens (scanned layers,
bf16 activations, donated state); MFU = `training_flops_per_step` (models/cairn/models/flops.py,
encoder and decoder FLOPs for T5) / median step time after compilation / peak. The batch is
the largest that fits: the step is compiled for candidate batches (concurrently) and
`compiled.memory_analysis()` compared with the device's `bytes_limit` (less `--memory_margin`),
a line through the measured sizes predicting the next candidates. A row's `variants` (remat
`dots`, then `full`; for T5-XL float32 then bf16 parameters) are searched side by side and the
first whose batch reaches the row's minimum runs. Decoding rows time `predict_batch` (greedy,
key-value cache, no EOS) with the 128 new tokens and with one (the prefill alone); the decode
steps' time is the difference, and the roofline is every weight plus the KV cache written so
far, read once per step, at the HBM bandwidth.

On an NVIDIA GPU the `gpu` suite runs instead (`--suite` forces one; benchmarks/README.md, "GPU
rows"): llama_7b and llama_1b bf16 (MFU >= 55 %), llama_7b with fp8 matmuls (a step >= 1.4x
faster than bf16's), T5.1.1-XL (MFU >= 50 %), llama_7b decoding at batch 1 and 32 (>= 85 % and
75 % of the roofline) and the fp8-vs-bf16 loss after 200 steps (within 1 %), after a check of
cuDNN's attention against XLA's on the rows' shapes.

Config fields this main may not have yet (`attention_implementation`, `param_dtype`,
`loss_chunk_size`, `TrainerConfig.offload_optimizer_state`) are applied where the dataclass has
them and listed as ignored otherwise. Each row's failure is recorded in its row; the rows run in
one worker process, restarted for the remaining rows after a crash or a runtime failure, and
killed at `--budget_s` (the table shows what finished).

    python3 benchmarks/accel_bench.py --json /tmp/accel.json            # every row, on the chip
    python3 benchmarks/accel_bench.py --rows llama_bf16,decode_b32      # some rows
    .venv/bin/python benchmarks/accel_bench.py --tiny                   # the CPU smoke run (< 60 s)
    .venv/bin/python benchmarks/accel_bench.py --tiny --suite gpu       # the GPU rows' CPU smoke run
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _accel_plan, _machine (also when imported)

from _accel_plan import (
    DECODE_VARIANTS,
    REMAT_POLICIES,
    SUITES,
    format_attention_check,
    format_profile,
    format_table,
    inherited_batches,
    resolve_suite,
    select_rows,
    tiny_rows,
    with_speedup,
    write_json,
)
from _machine import machine_line

WORKER_EXIT_RESTART = 3  # the worker stopped after a failed row: start a fresh one for the rest
HEAVY_MODULES = ("tensorflow", "ml_collections")  # nothing on the rows' import path may pull these in


def runs_on_gpu() -> bool:
    """`cairn.partitioning.gpu_flags.runs_on_gpu()`, the module loaded from its file: it is
    standard library only, but its package's `__init__` imports JAX, which this process must not."""
    path = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "partitioning/cairn/partitioning/gpu_flags.py"
    )
    spec = importlib.util.spec_from_file_location("_accel_bench_gpu_flags", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.runs_on_gpu()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    names = "; ".join(f"{k}: {', '.join(r.name for r in rows)}" for k, rows in SUITES.items())
    p.add_argument("--rows", default="all", help=f"comma-separated rows of the suite (default all; {names})")
    p.add_argument(
        "--suite",
        default="auto",
        choices=("auto", *SUITES),
        help="the rows of one accelerator (default auto: gpu when JAX will start on an NVIDIA GPU, else tpu)",
    )
    p.add_argument(
        "--no_attention_check",
        action="store_true",
        help="skip the gpu suite's check of cuDNN's attention against XLA's before the rows",
    )
    p.add_argument("--tiny", action="store_true", help="tiny presets and shapes: the CPU smoke run")
    p.add_argument("--json", help="write the environment, the options and every row's result here")
    p.add_argument(
        "--peak_tflops",
        type=float,
        help="per-device dense peak (default: the device kind's published bf16 peak; CPU: a matmul probe)",
    )
    p.add_argument(
        "--hbm_gbps",
        type=float,
        help="per-device HBM bandwidth, GB/s (default: the device kind's published figure; CPU: a copy probe)",
    )
    p.add_argument(
        "--attention",
        choices=("auto", "xla", "pallas", "cudnn"),
        help="attention_implementation of every model (default: the config's)",
    )
    p.add_argument(
        "--loss_chunk_size",
        type=int,
        help="tokens per chunk of the chunked loss for the training rows (0: whole logits; default: the row's)",
    )
    p.add_argument(
        "--remat",
        default="",
        help=f"a remat policy ({', '.join(REMAT_POLICIES)}) for every training row instead of its variants, "
        "or for some rows: t5_xl=full,llama_bf16=dots; ROW=A|B tries A, then B where A does not fit",
    )
    p.add_argument(
        "--decode_variants",
        default="model",
        help=f"ways of writing the decode cache each decode row compares ({', '.join(DECODE_VARIANTS)}); "
        "the row reports the fastest",
    )
    p.add_argument("--batch", type=int, default=0, help="a fixed batch for the training rows instead of the search")
    p.add_argument(
        "--batches",
        default="",
        help="fixed batches of some training rows, e.g. llama_bf16=8,t5_large=96 (a rerun skips their search)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=0,
        help="training steps per row, the first (compilation) untimed (default: the row's, 6)",
    )
    p.add_argument(
        "--memory_limit_gb",
        type=float,
        help="device memory a program may use, GiB (default: bytes_limit less the margin)",
    )
    p.add_argument("--memory_margin", type=float, default=0.03, help="share of bytes_limit kept free (fragmentation)")
    p.add_argument("--compile_threads", type=int, default=6, help="step compilations at once during the batch search")
    p.add_argument("--compile_cache", help="a persistent compilation cache directory (reruns compile nothing)")
    p.add_argument("--budget_s", type=float, default=570.0, help="the worker is killed after this many seconds")
    p.add_argument(
        "--profile",
        action="store_true",
        help="trace 2 more steps per training row (one more call per decode row) and report device time per op class",
    )
    p.add_argument(
        "--topology",
        help="compile only, for a described TPU slice (e.g. v5e:1x1) on this host (libtpu, no TPU): each training "
        "row's batch search against the chip's memory, and nothing timed (decoding rows are skipped)",
    )
    p.add_argument("--in_process", action="store_true", help="run the rows in this process (no worker, no restarts)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker_results", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_margin < 0 or args.memory_margin >= 1:
        p.error(f"--memory_margin must be in [0, 1), got {args.memory_margin}")
    for name in ("batch", "steps", "loss_chunk_size"):
        value = getattr(args, name)
        if value is not None and value < 0:
            p.error(f"--{name} must be >= 0, got {value}")
    args.suite_name = resolve_suite(args.suite, args.suite == "auto" and runs_on_gpu(), args.topology)
    suite = SUITES[args.suite_name]
    try:
        args.batch_of = parse_batches(args.batches, [r.name for r in suite])
        args.remat_of = parse_remat(args.remat, [r.name for r in suite])
        args.decode_variant_list = parse_decode_variants(args.decode_variants)
    except ValueError as e:
        p.error(str(e))
    if args.steps == 1:
        p.error("--steps must be >= 2: the first step compiles and is not timed")
    try:
        args.selected = select_rows(args.rows, tiny_rows(suite) if args.tiny else suite)
    except ValueError as e:
        p.error(f"{e} (suite {args.suite_name}: --suite chooses)")
    # the gpu suite compares cuDNN's attention with XLA's first (not when compiling for a described TPU)
    args.attention_check = args.suite_name == "gpu" and not args.topology and not args.no_attention_check
    return args


def parse_batches(text: str, names: Sequence[str]) -> dict[str, int]:
    """`{"llama_bf16": 8, ...}` from `llama_bf16=8,...`; a ValueError names a bad entry."""
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, value = item.partition("=")
        if name not in names or not value.isdigit() or int(value) < 1:
            raise ValueError(f"--batches: expected ROW=BATCH with ROW one of {', '.join(names)}, got {item!r}")
        out[name] = int(value)
    return out


def parse_remat(text: str, names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """`{"*": ("full",)}` from `full`, `{"t5_xl": ("full",), ...}` from `t5_xl=full,...`; a row
    may list policies to try in order, the first that fits running: `llama_bf16=attention_kernel|full`."""
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, sep, value = item.rpartition("=") if "=" in item else ("*", "", item)
        policies = tuple(p.strip() for p in value.split("|"))
        if (sep and name not in names) or not all(p in REMAT_POLICIES for p in policies):
            raise ValueError(
                f"--remat: expected POLICY or ROW=POLICY[|POLICY...] with POLICY one of {', '.join(REMAT_POLICIES)}"
                f" and ROW one of {', '.join(names)}, got {item!r}"
            )
        out[name] = policies
    return out


def parse_decode_variants(text: str) -> list[str]:
    """The decode-cache writes to compare, in order; a ValueError names an unknown one."""
    out = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in out if x not in DECODE_VARIANTS]
    if bad or not out:
        raise ValueError(f"--decode_variants: expected some of {', '.join(DECODE_VARIANTS)}, got {text!r}")
    return out


def options(args: argparse.Namespace):
    """The `_accel_rows.Options` of the command line (imports JAX)."""
    from _accel_rows import Options

    return Options(
        peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None,
        hbm_bandwidth=args.hbm_gbps * 1e9 if args.hbm_gbps else None,
        attention=args.attention,
        loss_chunk_size=args.loss_chunk_size,
        remat=args.remat_of,
        decode_variants=tuple(args.decode_variant_list),
        batch=args.batch,
        batches=args.batch_of,
        steps=args.steps,
        memory_limit=args.memory_limit_gb * 2**30 if args.memory_limit_gb else None,
        memory_margin=args.memory_margin,
        compile_threads=args.compile_threads,
        profile=args.profile,
        topology=args.topology,
    )


def _set_compile_cache(path: str | None) -> None:
    if not path:
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


def run_rows(args: argparse.Namespace, emit, restart_after_failure: bool = False) -> None:
    """Runs the selected rows here; `emit(event)` gets `env`, the `attention_check` (the gpu
    suite), then `start` and `done` per row. With `restart_after_failure` (the worker), exits
    with WORKER_EXIT_RESTART after a row whose failure may have left the device unusable, so
    that a fresh process runs the rest."""
    _set_compile_cache(args.compile_cache)
    from _accel_rows import attention_check, environment, run_row

    opts = options(args)
    env = environment(opts)
    env["suite"] = args.suite_name
    env["heavy_modules_imported"] = [m for m in HEAVY_MODULES if m in sys.modules]
    emit({"event": "env", "env": env})
    mismatch = suite_mismatch(args, env.get("platform"))
    if mismatch:
        for row in args.selected:
            emit({"event": "done", "row": row.name, "result": {"row": row.name, "status": "error", "error": mismatch}})
        return
    if args.attention_check:
        emit({"event": "attention_check", "check": attention_check(args.selected)})
    done: dict[str, dict] = {}
    for row in args.selected:
        for name, batch in inherited_batches([row], done).items():  # the batch its source row found
            opts.batches.setdefault(name, batch)
        emit({"event": "start", "row": row.name})
        result = run_row(row, env, opts)
        for module in HEAVY_MODULES:
            result[f"{module}_imported"] = module in sys.modules
        done[row.name] = result
        emit({"event": "done", "row": row.name, "result": result})
        if restart_after_failure and result.get("restart") and row is not args.selected[-1]:
            raise SystemExit(WORKER_EXIT_RESTART)


def suite_mismatch(args: argparse.Namespace, platform: str | None) -> str | None:
    """Why the rows cannot run: `--suite auto` chose before JAX started (a CUDA plugin installed:
    gpu) and JAX's devices are of another kind; None when they match or the suite was given."""
    if args.suite != "auto" or args.topology or (platform == "gpu") == (args.suite_name == "gpu"):
        return None
    return f"--suite auto chose {args.suite_name} before JAX started, but its devices are {platform}: pass --suite"


def worker(args: argparse.Namespace) -> None:
    """The worker process: appends one JSON line per event to `--worker_results`."""
    with open(args.worker_results, "a") as out:

        def emit(event):
            out.write(json.dumps(event, default=str) + "\n")
            out.flush()

        run_rows(args, emit, restart_after_failure=True)


class Collector:
    """The supervisor's view of the results: the environment, the attention check, each row's
    result (printed as it arrives and written to `--json` at once, so a run cut short keeps what
    finished; a row compared with another gets its `speedup` here)."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.env, self.results, self.started = args, {}, {}, None
        self.check: dict | None = None
        self.checking = False  # the worker is comparing attention (no row started yet)

    def event(self, e: Mapping[str, Any]) -> None:
        if e["event"] == "env":
            self.env = e["env"]
            self.checking = self.args.attention_check and self.check is None
            print(env_line(self.env), flush=True)
        elif e["event"] == "attention_check":
            self.checking = False
            self.check = dict(e["check"])
            print(format_attention_check(self.check), flush=True)
            self.save()
        elif e["event"] == "start":
            self.checking = False
            self.started = e["row"]
        elif e["event"] == "done":
            self.started = None
            self.add(e["result"])

    def add(self, result: Mapping[str, Any]) -> None:
        self.results[result["row"]] = with_speedup(result, self.results)
        print("row done: " + format_table([self.results[result["row"]]]).splitlines()[-1], flush=True)
        self.save()

    def fail(self, row: str, error: str) -> None:
        self.add({"row": row, "kind": "-", "status": "error", "error": error})

    def fail_check(self, error: str) -> None:
        self.checking = False
        self.check = {"comparison": "-", "cases": [], "ok": False, "error": error}
        print(format_attention_check(self.check), flush=True)
        self.save()

    def ordered(self) -> list[dict]:
        return [self.results[r.name] for r in self.args.selected if r.name in self.results]

    def ok(self) -> bool:
        """Every selected row finished ok and the attention check (where it ran) passed."""
        results = self.ordered()
        rows_ok = bool(results) and all(r.get("status") == "ok" for r in results)
        return rows_ok and (self.check is None or bool(self.check.get("ok")))

    def save(self) -> None:
        if self.args.json:
            extra = {"attention_check": self.check} if self.check is not None else None
            write_json(self.args.json, self.env, _json_args(self.args), self.ordered(), extra)


def _json_args(args: argparse.Namespace) -> dict:
    return {k: v for k, v in vars(args).items() if k not in ("selected", "batch_of", "worker", "worker_results")}


def env_line(env: Mapping[str, Any]) -> str:
    peak = env.get("peak_flops_per_device")
    hbm = env.get("hbm_bytes_per_s")
    limit = env.get("bytes_limit")
    return (
        f"device: {env.get('device_kind')} x{env.get('devices')} ({env.get('platform')}); "
        f"peak {'-' if not peak else f'{peak / 1e12:.3g}'} TFLOP/s ({env.get('peak_source')}); "
        f"HBM {'-' if not hbm else f'{hbm / 1e9:.0f}'} GB/s ({env.get('hbm_source')}); "
        f"bytes_limit {'-' if not limit else f'{limit / 2**30:.2f} GiB'}; suite {env.get('suite')}; "
        + " ".join(f"{k} {v}" for k, v in env.get("versions", {}).items() if v)
        + "".join(f"; IMPORTED {m}" for m in env.get("heavy_modules_imported", []))
    )


def _read_events(path: str, offset: int) -> tuple[list[dict], int]:
    """Complete JSON lines of `path` from byte `offset`; the new offset."""
    try:
        with open(path) as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind("\n") + 1
    return [json.loads(line) for line in data[:end].splitlines() if line.strip()], offset + end


def supervise(args: argparse.Namespace, argv: Sequence[str]) -> Collector:
    """Runs the rows in worker processes: one normally, a fresh one for the rows left after a
    worker died or stopped after a failed row; the worker is killed at `--budget_s`."""
    col = Collector(args)
    deadline = time.monotonic() + args.budget_s
    workers = 0
    while True:
        remaining = [r.name for r in args.selected if r.name not in col.results]
        if not remaining:
            break
        if workers > len(args.selected) or time.monotonic() >= deadline:
            for name in remaining:
                col.fail(name, "not run: the --budget_s deadline passed" if time.monotonic() >= deadline else "not run")
            break
        workers += 1
        fd, path = tempfile.mkstemp(prefix="accel_bench_", suffix=".jsonl")
        os.close(fd)
        cmd = [sys.executable, os.path.abspath(__file__), *argv, "--worker", "--worker_results", path]
        cmd += ["--rows", ",".join(remaining)]
        if col.check is not None:  # compared once, by the first worker
            cmd.append("--no_attention_check")
        batches = {**inherited_batches(args.selected, col.results), **args.batch_of}
        if batches:  # the last --batches wins: the user's and those a finished row passes on
            cmd += ["--batches", ",".join(f"{k}={v}" for k, v in batches.items())]
        proc = subprocess.Popen(cmd)
        offset, killed = 0, False
        while True:
            try:
                rc = proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                rc = None
            events, offset = _read_events(path, offset)
            for e in events:
                col.event(e)
            if rc is not None:
                break
            if time.monotonic() >= deadline:
                proc.kill()
                proc.wait()
                killed = True
                break
        events, offset = _read_events(path, offset)
        for e in events:
            col.event(e)
        os.unlink(path)
        if col.checking:
            col.fail_check(f"the worker process died (exit code {rc}) during the check")
        if col.started is not None:
            why = (
                "killed at the --budget_s deadline"
                if killed
                else f"the worker process died (exit code {rc}) in this row"
            )
            col.fail(col.started, why)
            col.started = None
        if rc == 0 and not killed:
            for name in remaining:
                if name not in col.results:
                    col.fail(name, "not reported by the worker")
    return col


# XLA:CPU without LLVM's optimisation passes: tiny programs compile in a fraction of the time
# (the tests' setting, tools/testing/process_log/sitecustomize.py).
FAST_CPU_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")


def tiny_speedups(environ, args: argparse.Namespace) -> None:
    """`--tiny`: the fast XLA:CPU flags, and a temporary persistent compilation cache (rows of
    the same tiny shapes, such as both T5 rows, compile once) unless `--compile_cache` names one."""
    present = {flag.split("=")[0] for flag in environ.get("XLA_FLAGS", "").split()}
    extra = [f for f in FAST_CPU_XLA_FLAGS if f.split("=")[0] not in present]
    environ["XLA_FLAGS"] = " ".join([environ.get("XLA_FLAGS", ""), *extra]).strip()
    if not args.compile_cache:
        args.compile_cache = tempfile.mkdtemp(prefix="accel_bench_cache_")
        environ["JAX_COMPILATION_CACHE_DIR"] = args.compile_cache
        environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    print(machine_line(), flush=True)
    if args.tiny:
        tiny_speedups(os.environ, args)
    start = time.perf_counter()
    if args.in_process:
        col = Collector(args)
        run_rows(args, col.event)
    else:
        col = supervise(args, argv)
    results = col.ordered()
    print()
    for r in results:
        if r.get("profile", {}).get("classes_ms_per_step"):
            print(format_profile(r))
    if col.check is not None:
        print(format_attention_check(col.check) + "\n")
    print(format_table(results))
    print(f"{len(results)} rows in {time.perf_counter() - start:.0f} s" + (f"; JSON: {args.json}" if args.json else ""))
    return 0 if col.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
