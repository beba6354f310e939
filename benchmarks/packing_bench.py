"""Packing modes of the deterministic reader: greedy (the default, seqio's rows) against
first-fit (`packing="first_fit"`, window `--window`) on deterministic_bench.py's task.

  PYTHONPATH=storage:tokenizers:datatasks .venv/bin/python benchmarks/packing_bench.py [--lines N] [--batches N]

Prints, per mode: the plan's build time, the fill of the target slots (non-padding
`decoder_target_tokens` / all of them) and of the input slots over the timed batches,
non-padding tokens (inputs + targets) per second and batches per second.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from _machine import machine_line  # benchmarks/ is sys.path[0] when run as a script

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from deterministic_bench import BATCH, LENGTHS, LIB_PATHS, cache_job  # noqa: E402


def packing_figures(root: str, batches: int, warmup: int, window: int) -> dict:
    """Fill and tokens/s of the packed deterministic reader per packing mode."""
    import numpy as np

    import cairn.datatasks as dt
    from cairn.datatasks.deterministic import DeterministicReader

    out = {}
    for mode in ("greedy", "first_fit"):
        start = time.perf_counter()
        reader = DeterministicReader(
            "det_bench",
            os.path.join(root, "cache"),
            seed=0,
            global_batch_size=BATCH,
            sequence_length=LENGTHS,
            feature_converter=dt.EncDecFeatureConverter(pack=True),
            packing=mode,
            packing_window=window,
        )
        build = time.perf_counter() - start
        for _ in range(warmup):
            next(reader)
        used = {"encoder_input_tokens": 0, "decoder_target_tokens": 0}
        slots = dict.fromkeys(used, 0)
        start = time.perf_counter()
        for _ in range(batches):
            batch = next(reader)
            for k in used:
                used[k] += int(np.count_nonzero(batch[k]))
                slots[k] += batch[k].size
        seconds = time.perf_counter() - start
        reader.close()
        out[mode] = {
            "build_s": build,
            "target_fill": used["decoder_target_tokens"] / slots["decoder_target_tokens"],
            "input_fill": used["encoder_input_tokens"] / slots["encoder_input_tokens"],
            "tokens_s": sum(used.values()) / seconds,
            "batches_s": batches / seconds,
        }
    return out


def print_packing(figures: dict, window: int) -> None:
    print(f"{'packing':22s}{'plan s':>8s}{'target fill':>13s}{'input fill':>12s}{'tokens/s':>12s}{'batches/s':>11s}")
    for mode, f in figures.items():
        label = f"{mode} (window {window})" if mode == "first_fit" else mode
        print(
            f"{label:22s}{f['build_s']:8.2f}{f['target_fill']:13.2%}{f['input_fill']:12.2%}"
            f"{f['tokens_s']:12,.0f}{f['batches_s']:11.1f}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lines", type=int, default=100_000)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--batches", type=int, default=200, help="packed batches timed")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--window", type=int, default=128, help="first-fit packing window")
    p.add_argument(
        "--cache-dir",
        default=os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "cairn-benchmarks"),
    )
    args = p.parse_args()
    print(machine_line(), flush=True)
    sys.path[:0] = LIB_PATHS
    from tokenizers_bench import shakespeare_lines, trained_model

    lines = shakespeare_lines()[: args.lines]
    model, _ = trained_model(shakespeare_lines(), args.cache_dir, False)
    with tempfile.TemporaryDirectory() as root:
        cache_job(root, model, lines, args.files)
        print(f"{len(lines):,} lines in {args.files} files; lengths {LENGTHS}; global batch {BATCH}")
        print_packing(packing_figures(root, args.batches, args.warmup, args.window), args.window)


if __name__ == "__main__":
    main()
