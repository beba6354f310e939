"""Decoder-only decoding with a prefill against forcing the prompt token by token.

  .venv/bin/python benchmarks/prefill_bench.py [--repeats 5] [--preset decoder_only_tiny]

`decoder_only_tiny` (random weights), batch 8, prompts of 64 tokens, 64 generated tokens
(`max_decode_length` 128, no EOS so no early stop), greedy, float32, key-value cache. The
prefill path runs one forward pass over the prompts then 64 steps; the forcing path
(`DecodeOptions(prefill=False)`) runs 128 steps. Tokens/s count prompt and generated tokens
(8 x 128 per call); times are medians after compilation and a warm-up call. Both paths give
the same tokens (checked).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

from _machine import machine_line  # benchmarks/ is sys.path[0] when run as a script

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(os.path.dirname(HERE), d) for d in ("models", "partitioning", "storage")]

import jax  # noqa: E402
import numpy as np  # noqa: E402

from cairn.models import DecodeOptions, DecoderOnlyModel, get_preset  # noqa: E402

BATCH, PROMPT, NEW = 8, 64, 64


def timed(fn, repeats: int) -> tuple[float, float]:
    """(compile + first call seconds, median seconds of `repeats` calls after a warm-up)."""
    t = time.perf_counter()
    fn()
    first = time.perf_counter() - t
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return first, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--preset", default="decoder_only_tiny")
    args = parser.parse_args()
    print(machine_line(), flush=True)
    config = get_preset(args.preset)
    model = DecoderOnlyModel(config)
    params = model.init(jax.random.PRNGKey(0))
    prompts = np.random.default_rng(0).integers(2, config.vocab_size, (BATCH, PROMPT)).astype(np.int32)
    outputs, rows = {}, []
    for name, prefill in (("prefill", True), ("forcing", False)):
        options = DecodeOptions(max_decode_length=PROMPT + NEW, eos_id=-1, prefill=prefill)
        fn = jax.jit(functools.partial(model.predict_batch, options=options))

        def call(fn=fn, name=name):
            outputs[name] = np.asarray(fn(params, prompts)[0])

        first, median = timed(call, args.repeats)
        rows.append((name, first, median, BATCH * (PROMPT + NEW) / median))
    np.testing.assert_array_equal(outputs["prefill"], outputs["forcing"])
    print(f"{args.preset}, batch {BATCH}, prompt {PROMPT}, decode {NEW}, {jax.default_backend()}")
    print("| path | compile + first call | median call | tokens/s |")
    print("|---|---|---|---|")
    for name, first, median, tps in rows:
        print(f"| {name} | {first:.2f} s | {median * 1e3:.1f} ms | {tps:,.0f} |")
    print(f"speed-up: {rows[1][2] / rows[0][2]:.2f}x")


if __name__ == "__main__":
    main()
