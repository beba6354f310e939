"""seqio's side of tokenizers_bench.py; run by .peer-venv/bin/python, prints JSON on stdout.

  .peer-venv/bin/python benchmarks/_seqio_tokenizers_peer.py --model M --lines-json L \\
      --extra-ids 100 --warmup 1 --repeats 5 --batch-size 256
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _tokenizer_measure as m


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--lines-json", required=True)
    p.add_argument("--extra-ids", type=int, default=100)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=256)
    args = p.parse_args()

    import seqio
    import tensorflow as tf
    import tensorflow_text

    with open(args.lines_json, encoding="utf-8") as f:
        lines = json.load(f)
    vocab = seqio.SentencePieceVocabulary(args.model, extra_ids=args.extra_ids)
    results = m.measure_all(vocab, lines, warmup=args.warmup, repeats=args.repeats, batch_size=args.batch_size)
    info = {
        "seqio": seqio.__version__,
        "tensorflow": tf.__version__,
        "tensorflow_text": tensorflow_text.__version__,
        "vocab_size": vocab.vocab_size,
    }
    json.dump({"info": info, "results": results}, sys.stdout)


if __name__ == "__main__":
    main()
