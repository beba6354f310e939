"""LoRA against full fine-tuning, llama_150m on this CPU: optimizer-state bytes and step time.

One process, one model, one batch (4 x 128 tokens, float32), the same optimizer (Cairn's AdamW,
`cairn.trainer.make_optimizer`) and the same train step (`cairn.trainer.make_train_step`, state
donated): full fine-tuning updates every parameter; LoRA (`cairn.models.lora`, rank 8, alpha 16,
attention q/k/v/o and the MLP) trains the adapters against the base held as the state's frozen
tree. Targets (issue 34): optimizer state at most 2 % of full fine-tuning's, step time at most
0.8x. The two steps alternate, so a load change on a shared machine hits both.

    .venv/bin/python benchmarks/lora_bench.py [--steps 5] [--rank 8] [--no-malloc-tuning]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _machine import libraries_on_path, machine_line, reexec_with_malloc_tuning

libraries_on_path()  # benchmarks/ is sys.path[0] when run as a script
if __name__ == "__main__":
    reexec_with_malloc_tuning()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from cairn.models import DecoderOnlyModel, LoraConfig, LoraModel, get_preset  # noqa: E402
from cairn.models.lora import adapter_count  # noqa: E402
from cairn.trainer import OptimizerConfig, make_optimizer, make_train_step  # noqa: E402
from cairn.trainer.train_state import TrainState  # noqa: E402

PRESET, BATCH, LENGTH = "llama_150m", 4, 128
TARGETS = {"opt_state": 0.02, "step": 0.8}


def make_batch(vocab: int) -> dict[str, np.ndarray]:
    rows = np.random.default_rng(0).integers(2, vocab, (BATCH, LENGTH + 1)).astype(np.int32)
    return {"decoder_input_tokens": rows[:, :-1], "decoder_target_tokens": rows[:, 1:]}


def nbytes(tree) -> int:
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


class Run:
    """One variant's jitted step (state donated) and its state."""

    def __init__(self, loss_fn, params, frozen=None):
        optimizer = make_optimizer(OptimizerConfig(name="adamw", weight_decay=0.0), 1e-4)
        self.step = jax.jit(make_train_step(loss_fn, optimizer, lambda s: 1e-4), donate_argnums=(0,))
        self.state = jax.jit(lambda p, f: TrainState.create(p, optimizer, jax.random.PRNGKey(0), f))(params, frozen)
        self.opt_bytes = nbytes(self.state.opt_state)
        self.times: list[float] = []
        self.losses: list[float] = []

    def __call__(self, batch, timed: bool = True) -> None:
        t = time.perf_counter()
        self.state, metrics = self.step(self.state, batch)
        loss = float(metrics["loss"])  # waits for the step
        if timed:
            self.times.append(time.perf_counter() - t)
        self.losses.append(loss)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=5, help="timed steps of each variant (after one untimed)")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--no-malloc-tuning", action="store_true", help="keep glibc's default allocator settings")
    args = p.parse_args()
    print(machine_line())
    model = DecoderOnlyModel(get_preset(PRESET))
    lora = LoraModel(model, LoraConfig(rank=args.rank, alpha=2.0 * args.rank))
    base = jax.jit(model.init)(jax.random.PRNGKey(0))
    batch = jax.device_put(make_batch(model.config.vocab_size))
    t = time.perf_counter()
    full = Run(model.loss_fn, jax.tree.map(lambda x: x.copy(), base))
    full(batch, timed=False)
    adapted = Run(lora.loss_fn, lora.init(jax.random.PRNGKey(1)), base)
    adapted(batch, timed=False)
    print(f"compile and first steps {time.perf_counter() - t:.1f} s; load {os.getloadavg()[0]:.2f}")
    for _ in range(args.steps):  # alternating
        full(batch)
        adapted(batch)
    n_base = sum(x.size for x in jax.tree.leaves(base))
    n_adapter = adapter_count(adapted.state.params)
    f_step, l_step = statistics.median(full.times), statistics.median(adapted.times)
    opt_ratio, step_ratio = adapted.opt_bytes / full.opt_bytes, l_step / f_step
    print(f"after: load {os.getloadavg()[0]:.2f}; first losses full {full.losses[0]:.4f}, lora {adapted.losses[0]:.4f}")
    print()
    print("| model | rank | trained params | optimizer state | step (median) | opt-state ratio | step ratio |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {PRESET} full fine-tuning | - | {n_base / 1e6:.1f}M | {full.opt_bytes / 2**20:.1f} MiB | "
        f"{f_step:.3f} s | 1 | 1 |"
    )
    print(
        f"| {PRESET} LoRA | {args.rank} | {n_adapter / 1e6:.2f}M | {adapted.opt_bytes / 2**20:.1f} MiB | "
        f"{l_step:.3f} s | {100 * opt_ratio:.2f} % (target <= {100 * TARGETS['opt_state']:.0f} %: "
        f"{'holds' if opt_ratio <= TARGETS['opt_state'] else 'MISSED'}) | {step_ratio:.2f}x (target <= "
        f"{TARGETS['step']}x: {'holds' if step_ratio <= TARGETS['step'] else 'MISSED'}) |"
    )
    print(f"\nsteps (s): full {[round(x, 3) for x in full.times]}, lora {[round(x, 3) for x in adapted.times]}")


if __name__ == "__main__":
    main()
