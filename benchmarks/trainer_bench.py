"""Trainer benchmark on this CPU: T5.1.1-tiny and -small.

For each model: steps/s and MFU of `Trainer.train`, the loop's throughput over the bare jitted
step (target >= 0.95x), and how long an asynchronous checkpoint save blocks the loop (target
< 10% of a step for the small model). The peer is the bare jitted step in the same run, on
pre-sharded batches; the loop gets the same host batches, generated before timing, and pays
for sharding them, its metric checks and its bookkeeping.

    PYTHONPATH=tokenizers:datatasks:partitioning:models:evaluation:trainer \
        .venv/bin/python benchmarks/trainer_bench.py [--steps 12] [--models t5_1_1_tiny,t5_1_1_small]
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
import tempfile
import time

from _machine import machine_line  # benchmarks/ is sys.path[0] when run as a script

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np

from cairn.partitioning import Partitioner, create_mesh, standard_logical_axis_rules
from cairn.trainer import (
    CheckpointConfig,
    OptimizerConfig,
    Trainer,
    TrainerConfig,
    cpu_matmul_peak_flops,
    factor_schedule,
)

SHAPES = {"t5_1_1_tiny": (16, 64, 64), "t5_1_1_small": (4, 64, 64)}  # batch, input length, target length


class Batches:
    """Deterministic random token batches with a JSON-able position."""

    def __init__(self, vocab: int, batch: int, inputs: int, targets: int):
        self.vocab, self.shape, self.position = vocab, (batch, inputs, targets), 0

    def __iter__(self):
        return self

    def __next__(self):
        batch = _make_batch(self.vocab, self.shape, self.position)
        self.position += 1
        return batch

    def get_state(self):
        return {"position": self.position}

    def set_state(self, state):
        self.position = int(state["position"])


@functools.lru_cache(maxsize=256)
def _make_batch(vocab: int, shape: tuple, position: int) -> dict:
    """The batch at `position`, generated once per process: the loop and the bare step both
    start from ready host batches, so data generation is not counted as loop overhead."""
    b, li, lt = shape
    rng = np.random.default_rng([0, position])
    tgt = rng.integers(2, vocab, size=(b, lt), dtype=np.int32)
    return {
        "encoder_input_tokens": rng.integers(2, vocab, size=(b, li), dtype=np.int32),
        "decoder_input_tokens": np.pad(tgt[:, :-1], ((0, 0), (1, 0))),
        "decoder_target_tokens": tgt,
        "decoder_loss_weights": np.ones((b, lt), np.float32),
    }


def flops_per_target_token(model, params, inputs: int, targets: int) -> float:
    """The model's `flops_per_token` if it has one; else 6 x (encoder params x input tokens +
    decoder params x target tokens) / target tokens, embeddings lookups excluded, attention
    scores included (12 x layers x length x heads x head_dim per token per stack)."""
    if getattr(model, "flops_per_token", None) is not None:
        value = model.flops_per_token
        return float(value() if callable(value) else value)
    cfg = model.config
    sizes = {jax.tree_util.keystr(p): int(np.prod(x.shape)) for p, x in jax.tree_util.tree_leaves_with_path(params)}
    enc = sum(n for k, n in sizes.items() if "encoder" in k and "embed" not in k)
    dec = sum(n for k, n in sizes.items() if "encoder" not in k and "token_embedder" not in k)
    attn = 12 * cfg.num_heads * cfg.head_dim
    total = 6 * (enc * inputs + dec * targets) + attn * (
        cfg.num_encoder_layers * inputs * inputs + cfg.num_decoder_layers * (targets * targets + targets * inputs)
    )
    return total / targets


def _loop(model, partitioner, model_dir, shape, steps, flops, peak) -> tuple:
    """Steps/s and MFU of `Trainer.train` over one logging interval (compilation excluded)."""
    cfg = TrainerConfig(
        model_dir=model_dir,
        num_train_steps=steps,
        log_every=steps,
        checkpoint_every=0,
        tensorboard=False,
        flops_per_token=flops,
        peak_flops=peak,
    )
    trainer = Trainer(
        model, OptimizerConfig(), factor_schedule(base_learning_rate=1.0, warmup_steps=100), partitioner, cfg
    )
    rows = []
    handler = _Capture(rows)
    logging.getLogger("cairn.trainer").addHandler(handler)
    try:
        trainer.train(Batches(model.config.vocab_size, *shape))
    finally:
        logging.getLogger("cairn.trainer").removeHandler(handler)
    return trainer, _metric(rows, "steps_per_second"), _metric(rows, "mfu")


def _bare(trainer, partitioner, model, shape, steps) -> float:
    """Steps/s of the jitted step alone, on pre-sharded batches."""
    state = trainer.initial_state()
    src = Batches(model.config.vocab_size, *shape)
    batches = [partitioner.shard_batch(next(src)) for _ in range(steps)]
    state, m = trainer.train_step(state, batches[0])
    jax.block_until_ready(m)
    start = time.perf_counter()
    for gb in batches[1:]:
        state, m = trainer.train_step(state, gb)
    jax.block_until_ready((state, m))
    return (steps - 1) / (time.perf_counter() - start)


def bench(name: str, steps: int, peak: float, rounds: int) -> dict:
    from cairn.models import EncoderDecoderModel, get_preset

    model = EncoderDecoderModel(get_preset(name))
    shape = SHAPES[name]
    partitioner = Partitioner(create_mesh({"data": -1, "model": 1}), standard_logical_axis_rules())
    out = {"model": name, "batch": f"{shape[0]}x{shape[1]}+{shape[2]}"}
    with tempfile.TemporaryDirectory() as tmp:
        probe = Trainer(model, OptimizerConfig(), 1e-3, partitioner, TrainerConfig(model_dir=tmp, num_train_steps=1))
        probe.setup(next(Batches(model.config.vocab_size, *shape)))
        flops = flops_per_target_token(model, probe.abstract_state.params, shape[1], shape[2])
        warm = Batches(model.config.vocab_size, *shape)
        for _ in range(steps + 1):  # generate the host batches before any timing
            next(warm)
        # Interleaved rounds, best of each: the machine is shared, so single runs are noisy.
        loop_sps, bare_sps, mfu = 0.0, 0.0, float("nan")
        for r in range(rounds):
            trainer, sps, m = _loop(model, partitioner, os.path.join(tmp, f"loop{r}"), shape, steps, flops, peak)
            if sps > loop_sps:
                loop_sps, mfu = sps, m
            bare = _bare(trainer, partitioner, model, shape, steps)
            bare_sps = max(bare_sps, bare)
            print(
                f"  {name} round {r}: loop {sps:.3f} steps/s, bare {bare:.3f} steps/s, load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
        out.update(loop_steps_per_s=loop_sps, bare_steps_per_s=bare_sps, loop_over_bare=loop_sps / bare_sps, mfu=mfu)

        # Saves: a checkpoint every 2 steps; how long each blocked the loop, over the step time.
        cfg = TrainerConfig(
            model_dir=os.path.join(tmp, "ckpt"),
            num_train_steps=9,
            log_every=100,
            checkpoint_every=2,
            tensorboard=False,
            checkpoint=CheckpointConfig(keep=2),
            flops_per_token=flops,
            peak_flops=peak,
        )
        saver = Trainer(model, OptimizerConfig(), 1e-3, partitioner, cfg)
        saver.train(Batches(model.config.vocab_size, *shape))
        blocked = saver.save_blocked_s[:-1]  # the last is the final save at the end of training
        out.update(save_blocked_s=float(np.median(blocked)), save_over_step=float(np.median(blocked)) * bare_sps)
    return out


class _Capture(logging.Handler):
    def __init__(self, rows):
        super().__init__()
        self.rows = rows

    def emit(self, record):
        self.rows.append(record.getMessage())


def _metric(rows, name: str) -> float:
    for line in reversed(rows):
        for part in line.split():
            if part.startswith(name + "="):
                return float(part.split("=", 1)[1])
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--models", default="t5_1_1_tiny,t5_1_1_small")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print(machine_line(), flush=True)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("cairn.trainer").setLevel(logging.INFO)
    peak = cpu_matmul_peak_flops()
    print(
        f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}; "
        f"CPU matmul probe peak {peak / 1e9:.1f} GFLOP/s"
    )
    results = [bench(name, args.steps, peak, args.rounds) for name in args.models.split(",")]
    cols = [
        "model",
        "batch",
        "loop_steps_per_s",
        "bare_steps_per_s",
        "loop_over_bare",
        "mfu",
        "save_blocked_s",
        "save_over_step",
    ]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in results:
        print("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
