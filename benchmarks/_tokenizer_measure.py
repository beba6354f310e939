"""Encode-throughput measurements shared by cairn's side and seqio's (peer venv) side.

Both `tokenizers_bench.py` (in .venv) and `_seqio_tokenizers_peer.py` (in .peer-venv)
call `measure_all` on a vocabulary with the seqio-style API (`encode`, `encode_tf`), so
the two columns of the table come from the same code. Only the standard library is
imported at module level; TensorFlow is imported when a tf.data measurement runs.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

# Measurement names, in table order.
PY_ENCODE = "python encode, line by line"
TF_BATCHED = "encode_tf, tf.data batch({batch}) map"
TF_UNBATCHED = "encode_tf, tf.data unbatched map"


def _timed(fn: Callable[[], Any], warmup: int, repeats: int) -> tuple[list[float], Any]:
    result = None
    for _ in range(warmup):
        result = fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def _summary(n_lines: int, times: list[float], tokens: int) -> dict:
    rates = [n_lines / t for t in times]
    return {"median_lines_per_s": statistics.median(rates), "rates": rates, "seconds": times, "tokens": int(tokens)}


def ids_digest(rows: Sequence[Sequence[int]]) -> str:
    """SHA-256 over the id rows, to check that two tokenizers agree on every line."""
    h = hashlib.sha256()
    for row in rows:
        h.update(",".join(map(str, row)).encode())
        h.update(b";")
    return h.hexdigest()


def measure_python_encode(vocab, lines: Sequence[str], warmup: int, repeats: int) -> dict:
    encode = vocab.encode

    def run():
        return [encode(line) for line in lines]

    times, rows = _timed(run, warmup, repeats)
    out = _summary(len(lines), times, sum(len(r) for r in rows))
    out["ids_sha256"] = ids_digest(rows)
    return out


def _tf_dataset(lines: Sequence[str]):
    import tensorflow as tf

    return tf, tf.data.Dataset.from_tensor_slices(tf.constant(list(lines), dtype=tf.string))


def _count_tokens(tf, ds, ragged: bool):
    """Consumes `ds` inside TensorFlow (no Python per element) and returns the token count."""
    if ragged:
        size = lambda x: tf.size(x.flat_values, out_type=tf.int64)
    else:
        size = lambda x: tf.size(x, out_type=tf.int64)
    return ds.reduce(tf.constant(0, tf.int64), lambda acc, x: acc + size(x)).numpy()


def measure_tf_batched(vocab, lines: Sequence[str], warmup: int, repeats: int, batch_size: int) -> dict:
    tf, ds = _tf_dataset(lines)
    ds = ds.batch(batch_size).map(vocab.encode_tf)
    times, tokens = _timed(lambda: _count_tokens(tf, ds, ragged=True), warmup, repeats)
    return _summary(len(lines), times, tokens)


def measure_tf_unbatched(vocab, lines: Sequence[str], warmup: int, repeats: int) -> dict:
    tf, ds = _tf_dataset(lines)
    ds = ds.map(vocab.encode_tf)
    times, tokens = _timed(lambda: _count_tokens(tf, ds, ragged=False), warmup, repeats)
    return _summary(len(lines), times, tokens)


def measure_all(
    vocab,
    lines: Sequence[str],
    *,
    warmup: int,
    repeats: int,
    batch_size: int,
    extra: dict[str, Callable[[], dict]] | None = None,
) -> dict[str, dict]:
    """Runs every measurement; returns {measurement name: summary}."""
    results = {
        PY_ENCODE: measure_python_encode(vocab, lines, warmup, repeats),
        TF_BATCHED.format(batch=batch_size): measure_tf_batched(vocab, lines, warmup, repeats, batch_size),
        TF_UNBATCHED: measure_tf_unbatched(vocab, lines, warmup, repeats),
    }
    for name, fn in (extra or {}).items():
        results[name] = fn()
    return results
