"""The served tokenizer (`SentencePieceGraph.encode`, plain TensorFlow ops) on long inputs, on one
core: today's implementation beside the one of an earlier commit (the peer), in the same run.

  .venv/bin/python benchmarks/serving_tokenizer_bench.py [--chars 10000,20000] [--repeats 5]
      [--text shakespeare|nospace|cjk] [--old-rev 47ab122] [--no-old] [--json FILE]

The model is tokenizers_bench.py's (vocab 8000, T5 defaults, trained on the `shakespeare`
package's lines and cached). Each input is the first N characters of those lines joined by
spaces (`--text nospace`: without spaces, one long word; `--text cjk`: seeded CJK ideographs
without spaces; the worst cases, as the Viterbi steps once per character of the longest word),
encoded as a batch of one by a `tf.function` with the serving signature (`[None]` strings),
traced and run once before the timed repeats; the table gives the median. The process is pinned
to one CPU (`os.sched_setaffinity`) and TensorFlow to one intra-op and one inter-op thread. The
peer is `tokenizers/cairn/tokenizers/sentencepiece_graph.py` as it was at `--old-rev` (read
with `git show`, the per-byte `tf.while_loop` implementation before issue 57).
Both must give SentencePiece's ids; the table says whether they do.
"""

from __future__ import annotations

import argparse
import importlib.util
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
sys.path.insert(0, os.path.join(REPO, "tokenizers"))
sys.path.insert(0, os.path.join(REPO, "storage"))
sys.path.insert(0, HERE)

PATH = "tokenizers/cairn/tokenizers/sentencepiece_graph.py"


def old_module(rev: str):
    """`sentencepiece_graph` as it was at `rev`, loaded under another name."""
    source = subprocess.run(["git", "show", f"{rev}:{PATH}"], cwd=REPO, check=True, capture_output=True).stdout
    folder = tempfile.mkdtemp(prefix="old_graph_")
    path = os.path.join(folder, "old_sentencepiece_graph.py")
    with open(path, "wb") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("old_sentencepiece_graph", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(graph_class, model: bytes, texts: dict, repeats: int, want: dict) -> dict:
    import tensorflow as tf

    graph = graph_class(model)
    encode = tf.function(graph.encode, input_signature=[tf.TensorSpec([None], tf.string)])
    out = {}
    for n, text in texts.items():
        batch = tf.constant([text])
        start = time.perf_counter()
        ids = encode(batch).to_list()[0]
        first = time.perf_counter() - start
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            encode(batch)
            times.append(time.perf_counter() - start)
        out[n] = {"first_s": first, "times_s": times, "median_s": statistics.median(times), "same": ids == want[n]}
    return out


def texts_n(args: argparse.Namespace) -> list[int]:
    return [int(n) for n in args.chars.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chars", default="10000,20000")
    parser.add_argument(
        "--text",
        choices=["shakespeare", "nospace", "cjk"],
        default="shakespeare",
        help="nospace: Shakespeare without spaces (one word); cjk: seeded CJK ideographs, no spaces",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--old-repeats", type=int, default=3)
    parser.add_argument("--old-rev", default="47ab122")
    parser.add_argument("--no-old", action="store_true")
    parser.add_argument("--cpu", type=int, default=None, help="the CPU to pin to (default: the first allowed)")
    parser.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/cairn-benchmarks"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    cpu = args.cpu if args.cpu is not None else min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import tokenizers_bench

    from cairn.tokenizers import SentencePieceVocabulary
    from cairn.tokenizers.sentencepiece_graph import SentencePieceGraph

    os.makedirs(args.cache_dir, exist_ok=True)
    lines = tokenizers_bench.shakespeare_lines()
    model_path, _ = tokenizers_bench.trained_model(lines, args.cache_dir, False)
    vocab = SentencePieceVocabulary(model_path)
    joined = " ".join(lines)
    if args.text == "nospace":
        joined = "".join(joined.split())
    elif args.text == "cjk":
        import numpy as np

        joined = "".join(chr(0x4E00 + int(i)) for i in np.random.default_rng(0).integers(0, 2000, max(texts_n(args))))
    texts = {n: joined[:n].encode("utf-8") for n in texts_n(args)}
    want = {n: vocab.encode(t) for n, t in texts.items()}
    print(machine_line())
    print(f"pinned to CPU {cpu}; TensorFlow {tf.__version__}, 1 intra-op and 1 inter-op thread; model {model_path}")
    new = measure(SentencePieceGraph, vocab.sp_model, texts, args.repeats, want)
    old = (
        None
        if args.no_old
        else measure(old_module(args.old_rev).SentencePieceGraph, vocab.sp_model, texts, args.old_repeats, want)
    )
    head = f"| characters | bytes | ids | {args.old_rev} (median) | today (median) | speedup"
    print(f"\n{head} | same ids as SentencePiece (old / today) |")
    print("|---|---|---|---|---|---|---|")
    for n, text in texts.items():
        o = old[n] if old else None
        old_s = f"{o['median_s']:.3f} s" if o else "-"
        ratio = f"{o['median_s'] / new[n]['median_s']:.0f}x" if o else "-"
        same = f"{o['same'] if o else '-'} / {new[n]['same']}"
        print(f"| {n} | {len(text)} | {len(want[n])} | {old_s} | {new[n]['median_s']:.3f} s | {ratio} | {same} |")
    print("\ntoday, each repeat (s):", {n: [round(t, 4) for t in r["times_s"]] for n, r in new.items()})
    if old:
        print(f"{args.old_rev}, each repeat (s):", {n: [round(t, 3) for t in r["times_s"]] for n, r in old.items()})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"today": new, "old": old, "old_rev": args.old_rev, "cpu": cpu}, f, indent=1)


if __name__ == "__main__":
    main()
