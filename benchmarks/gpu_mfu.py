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
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from _machine import machine_line  # benchmarks/ is sys.path[0] when run as a script

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for lib in ("storage", "tokenizers", "datatasks", "partitioning", "models", "evaluation", "trainer"):
    sys.path.insert(0, os.path.join(REPO, lib))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from cairn.models import DecoderOnlyModel, count_params, flops_per_token, get_preset  # noqa: E402
from cairn.partitioning import Partitioner, create_mesh, standard_logical_axis_rules  # noqa: E402
from cairn.trainer import (  # noqa: E402
    CheckpointConfig,
    OptimizerConfig,
    Trainer,
    TrainerConfig,
    cpu_matmul_peak_flops,
    published_peak_flops,
)

# MFU targets on one H200-class GPU (bf16), by preset; other presets print none.
TARGETS = {"decoder_only_1b": 0.45, "llama_1b": 0.50}


class SyntheticTokens:
    """Seeded random token rows `[batch, length + 1]`, split into decoder inputs and targets."""

    def __init__(self, vocab: int, batch: int, length: int):
        self.vocab, self.batch, self.length, self.position = vocab, batch, length, 0

    def __iter__(self):
        return self

    def __next__(self):
        rng = np.random.default_rng([7, self.position])
        self.position += 1
        rows = rng.integers(2, self.vocab, size=(self.batch, self.length + 1), dtype=np.int32)
        return {
            "decoder_input_tokens": rows[:, :-1],
            "decoder_target_tokens": rows[:, 1:],
            "decoder_loss_weights": np.ones((self.batch, self.length), np.float32),
        }

    def get_state(self):
        return {"position": self.position}

    def set_state(self, state):
        self.position = int(state["position"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="decoder_only_1b")
    p.add_argument("--batch", type=int, default=16, help="global batch (sequences)")
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--dtype", default="bfloat16", help="activation dtype")
    p.add_argument("--param_dtype", default="float32", help="parameter (and optimizer state) dtype")
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
    print(machine_line(), flush=True)

    devices = jax.devices()
    kind = devices[0].device_kind
    if args.peak_tflops:
        peak_per_device = args.peak_tflops * 1e12
    elif devices[0].platform == "cpu":  # a smoke run: the measured float32 matmul probe of this host
        peak_per_device = cpu_matmul_peak_flops() / len(devices)
    else:
        peak_per_device = published_peak_flops(kind)
    if not peak_per_device:
        raise SystemExit(f"no published peak for device kind {kind!r}: pass --peak_tflops")
    peak = peak_per_device * len(devices)
    config = get_preset(
        args.preset,
        dtype=args.dtype,
        param_dtype=args.param_dtype,
        scan_layers=not args.no_scan,
        remat_policy=args.remat,
    )
    model = DecoderOnlyModel(config, z_loss=1e-4, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    fpt = flops_per_token(config, {"targets": args.length})
    partitioner = Partitioner(create_mesh({"data": -1, "model": 1}), standard_logical_axis_rules())
    with tempfile.TemporaryDirectory() as model_dir:
        cfg = TrainerConfig(
            model_dir=model_dir,
            num_train_steps=args.steps,
            log_every=1,
            checkpoint_every=0,
            tensorboard=False,
            handle_sigterm=False,
            flops_per_token=fpt,
            peak_flops=peak,
            checkpoint=CheckpointConfig(keep=1, asynchronous=True),
        )
        trainer = Trainer(
            model, OptimizerConfig(name=args.optimizer, weight_decay=0.1, clip_grad_norm=1.0), 3e-4, partitioner, cfg
        )
        start = time.perf_counter()
        trainer.train(SyntheticTokens(config.vocab_size, args.batch, args.length))
        total = time.perf_counter() - start
        rows = [json.loads(line) for line in open(os.path.join(model_dir, "summaries", "metrics.jsonl"))]
    step_times = [r["value"] for r in rows if r["metric"] == "step_time_s"]
    losses = [r["value"] for r in rows if r["metric"] == "loss"]
    median = statistics.median(step_times)
    tokens = args.batch * args.length
    mfu = fpt * tokens / median / peak
    result = {
        "device": kind,
        "devices": len(devices),
        "preset": args.preset,
        "params": count_params(config),
        "batch": args.batch,
        "length": args.length,
        "dtype": args.dtype,
        "param_dtype": args.param_dtype,
        "optimizer": args.optimizer,
        "remat": args.remat,
        "scan": not args.no_scan,
        "model_tflops_per_step": fpt * tokens / 1e12,
        "peak_tflops": peak / 1e12,
        "median_step_s": median,
        "tokens_per_s": tokens / median,
        "mfu": mfu,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "wall_s_incl_compile": total,
    }
    print(f"{'device':24s}{kind} x{len(devices)}")
    for k in ("preset", "params", "batch", "length", "dtype", "param_dtype", "optimizer", "remat", "scan"):
        print(
            f"{k:24s}{result[k]:,}"
            if isinstance(result[k], int) and not isinstance(result[k], bool)
            else f"{k:24s}{result[k]}"
        )
    print(f"{'model TFLOP / step':24s}{result['model_tflops_per_step']:.2f}")
    print(f"{'step time (median)':24s}{median * 1e3:.1f} ms over {len(step_times)} steps")
    print(f"{'tokens/s':24s}{tokens / median:,.0f}")
    peak_kind = "float32 matmul probe" if devices[0].platform == "cpu" else "dense bf16"
    print(f"{'peak':24s}{peak / 1e12:.3g} TFLOP/s ({peak_kind})")
    target = TARGETS.get(args.preset)
    note = f"(target >= {target:.0%} on an H200-class GPU)" if target else "(no target for this preset)"
    print(f"{'MFU':24s}{100 * mfu:.1f} %   {note}")
    print(f"{'loss first -> last':24s}{losses[0]:.3f} -> {losses[-1]:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
