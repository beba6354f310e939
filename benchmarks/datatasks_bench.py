"""Pipeline throughput of cairn.datatasks against seqio 0.0.20, side by side, in one run.

  .venv/bin/python benchmarks/datatasks_bench.py [--packed-batches N] [--unpacked-batches N]

The task, identical on both sides: the non-empty lines of the `shakespeare` package's texts
(one text file), `inputs` = the first half of each line's words, `targets` = the second
half, a SentencePiece vocabulary of 8,000 pieces trained on those lines (+100 sentinels),
preprocessors `tokenize` and `append_eos_after_trim`, `EncDecFeatureConverter` with
lengths inputs 512 / targets 128, batch 32, no shuffling, one reader process. For
pack=True and pack=False it reports batches/s, non-padding tokens/s and source examples/s,
after a warm-up, as the median of the repeats. seqio runs in the peer venv
(`.peer-venv`, see `setup_peers.sh`): this same file, started with `--peer`, prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _machine import machine_line  # benchmarks/ is sys.path[0] when run as a script

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PEER_PYTHON = os.path.join(REPO, ".peer-venv", "bin", "python")
LENGTHS = {"inputs": 512, "targets": 128}
BATCH = 32
EXTRA_IDS = 100
# Iterators are kept alive until the process ends (os._exit): deleting a tf.data iterator
# while a tf.numpy_function call waits for the GIL can deadlock TensorFlow (the deleting
# thread holds the GIL). See datatasks/README.md, "Known issue".
_ALIVE: list = []


def halves(ds):
    """line -> {inputs: first half of the words, targets: the rest} (pure TF, both sides).

    Works on batches of 256 lines and unbatches, so both libraries get the same cheap
    task-specific step and the comparison measures the libraries' own work.
    """
    import tensorflow as tf

    def fn(lines):
        words = tf.strings.split(lines)
        half = words.row_lengths() // 2
        first = tf.ragged.range(words.row_lengths()) < tf.expand_dims(half, 1)
        return {
            "inputs": tf.strings.reduce_join(tf.ragged.boolean_mask(words, first), axis=1, separator=" "),
            "targets": tf.strings.reduce_join(tf.ragged.boolean_mask(words, ~first), axis=1, separator=" "),
        }

    return ds.batch(256).map(fn, num_parallel_calls=tf.data.AUTOTUNE).unbatch()


def cairn_dataset(model: str, data: str, pack: bool):
    sys.path[:0] = [os.path.join(REPO, "tokenizers"), os.path.join(REPO, "datatasks")]
    import cairn.datatasks as dt
    from cairn.datatasks import preprocessors as pp
    from cairn.tokenizers import SentencePieceVocabulary

    vocab = SentencePieceVocabulary(model, extra_ids=EXTRA_IDS)
    feats = {"inputs": dt.Feature(vocab), "targets": dt.Feature(vocab)}
    task = dt.Task(
        "shakespeare_halves",
        dt.TextLineDataSource({"train": data}),
        feats,
        [halves, pp.tokenize, pp.append_eos_after_trim],
    )
    return dt.get_dataset(
        task,
        LENGTHS,
        dt.EncDecFeatureConverter(pack=pack),
        shuffle=False,
        num_epochs=1,
        batch_size=BATCH,
        trim_output_features=True,
    )


def seqio_dataset(model: str, data: str, pack: bool):
    import seqio

    vocab = seqio.SentencePieceVocabulary(model, extra_ids=EXTRA_IDS)
    name = f"shakespeare_halves_{int(pack)}"
    if name not in seqio.TaskRegistry.names():
        seqio.TaskRegistry.add(
            name,
            source=seqio.TextLineDataSource({"train": data}),
            preprocessors=[halves, seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
            output_features={"inputs": seqio.Feature(vocab), "targets": seqio.Feature(vocab)},
        )
    return seqio.get_dataset(
        name,
        LENGTHS,
        seqio.EncDecFeatureConverter(pack=pack),
        dataset_split="train",
        shuffle=False,
        num_epochs=1,
        batch_size=BATCH,
        seed=0,
    )


def measure(make, warmup: int, batches: int, repeats: int) -> dict:
    """Median rates over `repeats` runs of `batches` batches after `warmup` batches."""
    import numpy as np

    runs = []
    for _ in range(repeats):
        it = iter(make())
        _ALIVE.append(it)
        for _ in range(warmup):
            next(it)
        tokens = examples = 0
        start = time.perf_counter()
        for _ in range(batches):
            b = next(it)
            enc = b["encoder_input_tokens"].numpy()
            dec = b["decoder_target_tokens"].numpy()
            tokens += int(np.count_nonzero(enc)) + int(np.count_nonzero(dec))
            if "encoder_segment_ids" in b:
                examples += int(b["encoder_segment_ids"].numpy().max(axis=1).sum())
            else:
                examples += enc.shape[0]
        seconds = time.perf_counter() - start
        runs.append(
            {
                "batches_per_s": batches / seconds,
                "tokens_per_s": tokens / seconds,
                "examples_per_s": examples / seconds,
                "examples_per_row": examples / (batches * BATCH),
            }
        )
        time.sleep(3)  # the kept-alive iterator fills its buffers and goes quiet
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def first_batches(side: str, model: str, data: str, n: int) -> dict:
    """The first `n` batches of both modes, as `{"<mode>/<i>/<feature>": array}`."""
    build = cairn_dataset if side == "cairn" else seqio_dataset
    out = {}
    for pack in (True, False):
        it = iter(build(model, data, pack))
        _ALIVE.append(it)
        for i in range(n):
            b = next(it)
            for k, v in b.items():
                out[f"{'packed' if pack else 'unpacked'}/{i}/{k}"] = v.numpy()
    time.sleep(3)  # let the kept-alive iterators go quiet
    return out


def run_side(side: str, model: str, data: str, args) -> dict:
    build = cairn_dataset if side == "cairn" else seqio_dataset
    out = {}
    for pack, n in ((True, args.packed_batches), (False, args.unpacked_batches)):
        out["packed" if pack else "unpacked"] = measure(
            lambda pack=pack: build(model, data, pack), args.warmup, n, args.repeats
        )
    return out


def median_of(runs: list) -> dict:
    return {mode: {k: statistics.median(r[mode][k] for r in runs) for k in runs[0][mode]} for mode in runs[0]}


def print_table(cairn: dict, seqio: dict | str) -> None:
    cols = ("batches_per_s", "tokens_per_s", "examples_per_s")
    print(f"{'mode':10s}{'metric':16s}{'cairn':>12s}{'seqio 0.0.20':>14s}{'ratio':>9s}")
    for mode in ("packed", "unpacked"):
        for c in cols:
            ours = cairn[mode][c]
            theirs = seqio[mode][c] if isinstance(seqio, dict) else None
            ratio = f"{ours / theirs:8.2f}x" if theirs else "      -"
            peer = f"{theirs:14,.1f}" if theirs else f"{'-':>14s}"
            print(f"{mode:10s}{c:16s}{ours:12,.1f}{peer}{ratio}")
        print(
            f"{mode:10s}{'examples/row':16s}{cairn[mode]['examples_per_row']:12.2f}"
            + (f"{seqio[mode]['examples_per_row']:14.2f}" if isinstance(seqio, dict) else "")
        )
    if isinstance(seqio, str):
        print(f"seqio: {seqio}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--packed-batches", type=int, default=150)
    p.add_argument("--unpacked-batches", type=int, default=600)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--parity-batches", type=int, default=3, help="compare the first N batches of each mode with seqio's (0: skip)"
    )
    p.add_argument("--peer", action="store_true", help="internal: run seqio's side")
    p.add_argument("--dump", help="internal: where the peer writes its first batches")
    p.add_argument("--model")
    p.add_argument("--data")
    p.add_argument(
        "--cache-dir",
        default=os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "cairn-benchmarks"),
    )
    args = p.parse_args()
    print(machine_line(), flush=True)
    if args.peer:
        import seqio

        results = run_side("seqio", args.model, args.data, args)
        if args.dump and args.parity_batches:
            import numpy as np

            np.savez(args.dump, **first_batches("seqio", args.model, args.data, args.parity_batches))
        json.dump({"version": seqio.__version__, "results": results}, sys.stdout)
        sys.stdout.flush()
        os._exit(0)

    sys.path[:0] = [os.path.join(REPO, "tokenizers"), HERE]
    from tokenizers_bench import shakespeare_lines, trained_model  # the shared 8k model

    lines = shakespeare_lines()
    model, train_s = trained_model(lines, args.cache_dir, False)
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "shakespeare.txt")
        with open(data, "w", encoding="utf-8") as f:
            f.write("".join(line.replace("\r", " ") + "\n" for line in lines))
        print(
            f"{len(lines):,} lines; vocab 8000 + {EXTRA_IDS} sentinels "
            f"({'cached' if train_s is None else f'trained in {train_s:.0f} s'}); "
            f"lengths {LENGTHS}; batch {BATCH}; warm-up {args.warmup}, "
            f"median of {args.repeats}"
        )
        # Repeats alternate cairn and seqio, so a change in machine load hits both sides.
        runs_cairn, runs_seqio, parity, seqio = [], [], None, None
        one = argparse.Namespace(**{**vars(args), "repeats": 1})
        for r in range(args.repeats):
            runs_cairn.append(run_side("cairn", model, data, one))
            if not os.path.exists(PEER_PYTHON):
                seqio = "peer venv missing: run `bash benchmarks/setup_peers.sh`, then rerun"
                continue
            dump = os.path.join(tmp, "seqio.npz")
            cmd = [
                PEER_PYTHON,
                os.path.abspath(__file__),
                "--peer",
                "--model",
                model,
                "--data",
                data,
                "--packed-batches",
                str(args.packed_batches),
                "--unpacked-batches",
                str(args.unpacked_batches),
                "--warmup",
                str(args.warmup),
                "--repeats",
                "1",
                "--parity-batches",
                str(args.parity_batches if r == 0 else 0),
                "--dump",
                dump,
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                seqio = f"peer run failed ({proc.returncode}): {proc.stderr.strip()[-800:]}"
                break
            runs_seqio.append(json.loads(proc.stdout.strip().splitlines()[-1])["results"])
            if r == 0 and args.parity_batches:
                parity = compare(first_batches("cairn", model, data, args.parity_batches), dump)
        cairn = median_of(runs_cairn)
        if runs_seqio and seqio is None:
            seqio = median_of(runs_seqio)
    print_table(cairn, seqio)
    if parity:
        print(f"parity: {parity}")


def compare(ours: dict, peer_file: str) -> str:
    """'identical ...' or the first difference between our batches and seqio's."""
    import numpy as np

    theirs = dict(np.load(peer_file))
    if set(ours) != set(theirs):
        return f"different features: {sorted(set(ours) ^ set(theirs))[:6]}"
    for k in sorted(ours):
        if ours[k].shape != theirs[k].shape or not np.array_equal(ours[k], theirs[k]):
            return f"DIFFERENT at {k}"
    n = len({k.rsplit("/", 1)[0] for k in ours})
    return f"identical: the first {n // 2} batches of each mode, every feature, equal to seqio's"


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)
