"""MFU of `cairn.trainer` on one GPU: a ~1B-parameter decoder-only LM in bf16, synthetic tokens.

The prepared device check of the trainer issue: trains `decoder_only_1b` (emb 2048, 16 heads x
128, gated-GELU MLP 5120, 20 layers, vocab 32,128; 1.10B parameters) through `Trainer.train`
for a few dozen steps on random tokens, bf16 activations (float32 parameters and AdamW
state), scanned layers with the `dots` rematerialisation policy, and prints the step time
(median over the steps after compilation) and MFU against the device's dense bf16 peak
(989 TFLOP/s for an H100/H200; `--peak_tflops` overrides). Model FLOPs per step are
`cairn.models.flops_per_token(config, {"targets": L}) * batch * L` (forward + backward;
formula in models/cairn/models/flops.py: 6 x matmul params x tokens + logits + attention).

    .venv/bin/python benchmarks/gpu_mfu.py                          # on the GPU machine
    .venv/bin/python benchmarks/gpu_mfu.py --preset decoder_only_tiny --batch 2 --length 64 \
        --steps 4 --dtype float32                                   # a CPU smoke run

Llama: `--preset llama_1b --dtype bfloat16` trains Llama 3.2 1B's shape (emb 2048, 32 heads over
8 key/value heads x 64, SwiGLU MLP 8192, 16 layers, vocab 128,256, tied; 1.24B parameters) the
same way; its FLOPs count grouped-query attention and the three SwiGLU kernels.

    .venv/bin/python benchmarks/gpu_mfu.py --preset llama_1b --dtype bfloat16       # on the GPU machine
    .venv/bin/python benchmarks/gpu_mfu.py --preset llama_tiny --batch 2 --length 64 \
        --steps 2 --dtype float32                                   # a CPU smoke run

Targets: MFU >= 45% on one H200 for `decoder_only_1b` (issue #7), >= 50% for `llama_1b`
(`TARGETS`). The GPU machine needs a CUDA build of jaxlib matching requirements.lock
(`pip install "jax[cuda12]==0.10.2"`); the repo's venv is CPU-only.
Not yet run on a GPU: no GPU machine was lent to the sessions so far (neither preset). On one
TPU v5e chip, `--preset llama_1b --param_dtype bfloat16 --optimizer adafactor --batch 2` gave
35.7 % MFU (benchmarks/RESULTS.md).

A thin wrapper over `accel_bench.py`'s training row (`_accel_rows.run_train_row`: the same
Trainer, synthetic tokens and MFU) with one fixed batch; `accel_bench.py` runs issue 39's rows
(the largest batch that fits, T5, decoding) on any accelerator.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/ (also when imported)

from _accel_plan import TrainRow
from _machine import machine_line

# MFU targets on one H200-class GPU (bf16), by preset; other presets print none.
TARGETS = {"decoder_only_1b": 0.45, "llama_1b": 0.50}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="decoder_only_1b")
    p.add_argument("--batch", type=int, default=16, help="global batch (sequences)")
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--dtype", default="bfloat16", help="activation dtype")
    p.add_argument(
        "--param_dtype", default="float32", help="parameter (and optimizer state) dtype, where the config has it"
    )
    p.add_argument(
        "--optimizer",
        default="adamw",
        choices=("adamw", "adafactor"),
        help="adamw (default) or adafactor (factored second moments: fits a 1B model's state on a 16 GiB chip)",
    )
    p.add_argument("--remat", default="dots", choices=("none", "full", "dots"))
    p.add_argument("--no_scan", action="store_true", help="unrolled layers instead of a scan")
    p.add_argument(
        "--peak_tflops",
        type=float,
        default=None,
        help="per-device dense peak; default: the published bf16 peak of the device kind (CPU: a measured probe)",
    )
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    if args.steps < 2:
        p.error("--steps must be >= 2: the first step compiles and is not timed")
    print(machine_line(), flush=True)

    from _accel_rows import Options, environment, run_row  # imports JAX

    adamw = args.optimizer == "adamw"
    row = TrainRow(
        "gpu_mfu",
        f"{args.preset} x {args.batch} x {args.length}",
        args.preset,
        {"targets": args.length},
        optimizer=args.optimizer,
        learning_rate=3e-4,
        optimizer_kwargs={"weight_decay": 0.1, "clip_grad_norm": 1.0} if adamw else {"clip_grad_norm": 1.0},
        overrides={
            "dtype": args.dtype,
            "param_dtype": args.param_dtype,
            "scan_layers": not args.no_scan,
            "remat_policy": args.remat,
        },
        batch=args.batch,
        steps=args.steps,  # the first compiles; the median is over the rest, as before
        target_mfu=TARGETS.get(args.preset),
    )
    opts = Options(peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None)
    env = environment(opts)
    if not env["peak_flops_per_device"]:
        raise SystemExit(f"no published peak for device kind {env['device_kind']!r}: pass --peak_tflops")
    r = run_row(row, env, opts)
    if r["status"] != "ok":
        raise SystemExit(f"gpu_mfu failed: {r['error']}")
    peak = env["peak_flops_per_device"] * env["devices"]
    result = {
        "device": env["device_kind"],
        "devices": env["devices"],
        "preset": args.preset,
        "params": r["params"],
        "batch": args.batch,
        "length": args.length,
        "dtype": args.dtype,
        "param_dtype": r["config_overrides"].get("param_dtype", "float32 (the config has no param_dtype)"),
        "optimizer": args.optimizer,
        "remat": args.remat,
        "scan": not args.no_scan,
        "model_tflops_per_step": r["model_tflops_per_step"],
        "peak_tflops": peak / 1e12,
        "median_step_s": r["step_s"],
        "tokens_per_s": r["tokens_per_s"],
        "mfu": r["mfu"],
        "first_loss": r["first_loss"],
        "last_loss": r["last_loss"],
        "wall_s_incl_compile": r["wall_s"],
        "compile_s": r["compile_s"],
    }
    print(f"{'device':24s}{env['device_kind']} x{env['devices']}")
    for k in ("preset", "params", "batch", "length", "dtype", "param_dtype", "optimizer", "remat", "scan"):
        value = result[k]
        print(f"{k:24s}{value:,}" if isinstance(value, int) and not isinstance(value, bool) else f"{k:24s}{value}")
    print(f"{'model TFLOP / step':24s}{result['model_tflops_per_step']:.2f}")
    print(f"{'step time (median)':24s}{r['step_s'] * 1e3:.1f} ms over {r['steps_timed']} steps")
    print(f"{'tokens/s':24s}{r['tokens_per_s']:,.0f}")
    peak_kind = "float32 matmul probe" if env["platform"] == "cpu" else "dense bf16"
    print(f"{'peak':24s}{peak / 1e12:.3g} TFLOP/s ({peak_kind})")
    target = TARGETS.get(args.preset)
    note = f"(target >= {target:.0%} on an H200-class GPU)" if target else "(no target for this preset)"
    print(f"{'MFU':24s}{100 * r['mfu']:.1f} %   {note}")
    print(f"{'loss first -> last':24s}{r['first_loss']:.3f} -> {r['last_loss']:.3f}")
    if r["ignored_overrides"]:
        print(f"{'ignored (not in config)':24s}{', '.join(r['ignored_overrides'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
