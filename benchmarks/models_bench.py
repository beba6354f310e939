"""Training-step time, tokens/s and MFU of cairn's T5.1.1-small, beside transformers' PyTorch T5;
greedy decoding tokens/s beside transformers' `generate`; the same for llama_150m
(`_llama_bench.py`); and a small MoE's step beside the dense model with its active parameters
(`_moe_bench.py`). `--model t5|llama|moe|all` picks the tables.

  .venv/bin/python benchmarks/models_bench.py [--steps 5] [--decode-steps 3] [--skip-torch] [--no-malloc-tuning]

Config (issue 6): T5.1.1-small (emb 512, 6 heads x 64, MLP 1024 gated-GELU, 8+8 layers,
vocab 32,128, no dropout), batch 8, inputs 128, targets 32, float32, Adafactor
(`cairn.trainer.adafactor_t5`, optax's Adafactor chain with T5's settings, for cairn;
torch.optim.Adafactor for transformers). Model FLOPs per step come from
`cairn.models.flops.training_flops_per_step` (about 200.7 GFLOP); the peak is a jitted
float32 2048x2048 matmul, the best of three medians of 10, measured in the same run (and
again at its end, printed beside the first). MFU = model FLOPs per step / step time / peak.
Every time is the median over the steps after a warm-up (and after compilation). Both sides
use the same random inputs; torch uses all cores.
Numbers need a quiet machine: other processes on the 2 cores lower every figure.

Allocator: XLA:CPU allocates each step's temporaries (~0.9 GB here) afresh; glibc serves
blocks that large with mmap and returns them with munmap, so every step page-faults them
in again (~225k faults, ~0.5 s of system time per step, and ~4k faults per peak matmul).
The script therefore re-executes itself once with
`GLIBC_TUNABLES=glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=...`
(one heap, no mmap, no trimming: freed memory is reused, faults drop to ~0 after warm-up),
for both columns and the peak alike; `--no-malloc-tuning` (or GLIBC_TUNABLES already set)
keeps the environment as it is.
"""

from __future__ import annotations

import argparse
import functools
import os
import time

from _machine import libraries_on_path, machine_line, reexec_with_malloc_tuning

HERE = os.path.dirname(os.path.abspath(__file__))
libraries_on_path()  # benchmarks/ is sys.path[0] when run as a script
if __name__ == "__main__":
    reexec_with_malloc_tuning()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from _timing import DECODE_FLOOR, ceiling_line, decode_floor, matmul_peak, median_time, target_line  # noqa: E402

from cairn.models import DecodeOptions, EncoderDecoderModel, get_preset, training_flops_per_step  # noqa: E402

BATCH, INPUTS, TARGETS = 8, 128, 32
T5_TARGETS = {"train": 2.0, "greedy": 2.0}  # speed ratios over transformers (issue 6)


def make_batch():
    rng = np.random.default_rng(0)
    vocab = get_preset("t5_1_1_small").vocab_size
    tgt = rng.integers(2, vocab, (BATCH, TARGETS)).astype(np.int32)
    return {
        "encoder_input_tokens": rng.integers(2, vocab, (BATCH, INPUTS)).astype(np.int32),
        "decoder_target_tokens": tgt,
        "decoder_input_tokens": np.pad(tgt[:, :-1], ((0, 0), (1, 0))),
        "decoder_loss_weights": np.ones_like(tgt, np.float32),
    }


def cairn_train_step(config, batch, steps: int):
    import optax

    from cairn.trainer.optimizers import adafactor_t5

    model = EncoderDecoderModel(config, z_loss=0.0)
    params = model.init(jax.random.PRNGKey(0))
    opt = adafactor_t5(1e-3)
    state = (params, opt.init(params))

    @functools.partial(jax.jit, donate_argnums=(0,))  # params and optimizer state updated in place
    def step(state, batch):
        params, opt_state = state
        (loss, _), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    batch = jax.device_put(batch)
    holder = [state]

    def run():
        holder[0], loss = step(holder[0], batch)
        loss.block_until_ready()

    t = time.perf_counter()
    run()
    compile_s = time.perf_counter() - t
    return median_time(run, steps), compile_s, model, holder[0][0]


def cairn_greedy(model, params, batch, repeats: int) -> float:
    options = DecodeOptions(max_decode_length=TARGETS, eos_id=-1)  # no early stop: always TARGETS tokens
    f = jax.jit(lambda p, b: model.predict_batch(p, b, options)[0])
    enc = {"encoder_input_tokens": batch["encoder_input_tokens"]}
    return median_time(lambda: f(params, enc).block_until_ready(), repeats)


def torch_model(config, params):
    import tempfile

    import transformers

    from cairn.models import export_hf

    with tempfile.TemporaryDirectory() as d:
        export_hf(params, config, d)
        return transformers.T5ForConditionalGeneration.from_pretrained(d)


def torch_train_step(model, batch, steps: int) -> float:
    import torch

    model.train()
    opt = torch.optim.Adafactor(model.parameters(), lr=1e-3)
    ids = torch.tensor(batch["encoder_input_tokens"], dtype=torch.long)
    dec = torch.tensor(batch["decoder_input_tokens"], dtype=torch.long)
    labels = torch.tensor(batch["decoder_target_tokens"], dtype=torch.long)

    def run():
        opt.zero_grad()
        loss = model(input_ids=ids, decoder_input_ids=dec, labels=labels).loss
        loss.backward()
        opt.step()

    return median_time(run, steps)


def torch_greedy(model, batch, repeats: int) -> float:
    import torch

    model.eval()
    ids = torch.tensor(batch["encoder_input_tokens"], dtype=torch.long)

    def run():
        with torch.no_grad():
            model.generate(input_ids=ids, max_new_tokens=TARGETS, min_new_tokens=TARGETS, do_sample=False, num_beams=1)

    return median_time(run, repeats)


def run_t5(peak: float, steps: int, decode_steps: int, skip_torch: bool) -> None:
    """Measures and prints the T5.1.1-small table (targets and verdicts included)."""
    config = get_preset("t5_1_1_small")
    batch = make_batch()
    flops = training_flops_per_step(config, BATCH, {"inputs": INPUTS, "targets": TARGETS})
    step_s, compile_s, model, params = cairn_train_step(config, batch, steps)
    decode_s = cairn_greedy(model, params, batch, decode_steps)
    tokens = BATCH * (INPUTS + TARGETS)
    rows = [("cairn (jax)", step_s, decode_s)]
    if not skip_torch:
        try:
            import torch

            tm = torch_model(config, params)
            rows.append(
                (
                    f"transformers (torch, {torch.get_num_threads()} thr)",
                    torch_train_step(tm, batch, steps),
                    torch_greedy(tm, batch, decode_steps),
                )
            )
        except ImportError as e:  # torch/transformers are test-only dependencies
            print(f"transformers column skipped: {e}")

    print(
        f"T5.1.1-small, batch {BATCH}, inputs {INPUTS}, targets {TARGETS}, float32, Adafactor; "
        f"{jax.device_count()} {jax.default_backend()} device(s), {os.cpu_count()} cores"
    )
    print(
        f"model FLOPs/step {flops / 1e9:.1f} GFLOP; matmul peak {peak / 1e9:.1f} GFLOP/s; "
        f"cairn compile {compile_s:.1f} s; GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '(unset)')}"
    )
    print(f"{'':34}{'step s':>8}{'tokens/s':>10}{'MFU':>7}{'greedy tok/s':>14}")
    for name, s, d in rows:
        print(f"{name:34}{s:8.2f}{tokens / s:10.0f}{flops / s / peak:7.1%}{BATCH * TARGETS / d:14.0f}")
    if len(rows) == 2:
        (_, s0, d0), (_, s1, d1) = rows
        print(f"{'cairn / transformers':34}{'':8}{s1 / s0:9.2f}x{'':7}{d1 / d0:13.2f}x  (speed ratios)")
        print(target_line("train step vs transformers", s1 / s0, T5_TARGETS["train"]))
        print(target_line("greedy vs generate", d1 / d0, T5_TARGETS["greedy"]))
        print(ceiling_line("train step", s1, flops / peak, T5_TARGETS["train"]))
        print(ceiling_line("greedy", d1, greedy_floor(config, params, peak), T5_TARGETS["greedy"], DECODE_FLOOR))


def greedy_floor(config, params, peak: float) -> float:
    """`_timing.decode_floor` of the greedy decode: the encoder is the prefill, and each of
    the TARGETS steps reads the decoder's weights (the logits kernel included)."""
    encoder = training_flops_per_step(config, BATCH, {"inputs": INPUTS, "targets": 1}) / 3  # forward only
    weights = sum(x.nbytes for x in jax.tree_util.tree_leaves(params["decoder"]))
    return decode_floor(encoder, peak, TARGETS, weights, BATCH)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", choices=("t5", "llama", "moe", "all"), default="all", help="which tables (default: all three)"
    )
    parser.add_argument("--llama-preset", default="llama_150m", help="Llama table's preset (llama_tiny: smoke)")
    parser.add_argument("--steps", type=int, default=5, help="timed training steps (after one warm-up)")
    parser.add_argument("--decode-steps", type=int, default=3, help="timed greedy decodes (after one warm-up)")
    parser.add_argument("--skip-torch", action="store_true", help="only cairn's column")
    parser.add_argument(
        "--no-malloc-tuning", action="store_true", help="keep glibc's default allocator settings (see the docstring)"
    )
    args = parser.parse_args()
    print(machine_line(), flush=True)
    peak = matmul_peak()
    if args.model in ("t5", "all"):
        run_t5(peak, args.steps, args.decode_steps, args.skip_torch)
    if args.model in ("llama", "all"):
        import _llama_bench

        if args.model == "all":
            print()
        _llama_bench.run(peak, args.steps, args.decode_steps, args.skip_torch, args.llama_preset)
    if args.model in ("moe", "all"):
        import _moe_bench

        if args.model == "all":
            print()
        _moe_bench.run(peak, args.steps)
    end_peak = matmul_peak()
    print(
        f"matmul peak at the end of the run {end_peak / 1e9:.1f} GFLOP/s (start {peak / 1e9:.1f}): "
        "MFU and the ceilings hold only as far as the two agree"
    )
    print(machine_line().replace("CPU:", "end of run, CPU:"))


if __name__ == "__main__":
    main()
