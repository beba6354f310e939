"""Small tasks for the deterministic-pipeline tests (byte vocabulary: nothing to train).

`make(data_dir, registry)` writes two text sources under `data_dir` (once) and registers
`det_a` (2 files), `det_b` (1 file) and the mixture `det_mix` (rates 2:1). Both tasks end
with a stochastic post-cache preprocessor (`noise`, length-preserving, seeded per record)
and `append_eos_after_trim`. `noise` has a NumPy twin (the same bytes: TensorFlow's stateless
RNG in NumPy), so a reader of these tasks runs without TensorFlow after the cache, as a user's
tasks with NumPy preprocessors do; `make(..., tf_noise=True)` gives tasks whose `noise` has
no twin, read through the reader's TensorFlow stage (tests of that path).
TensorFlow is imported on first use (`lazy_tf`): tests that only plan or permute never load it.
"""

import os
import pathlib

import numpy as np

import cairn.datatasks as dt
from cairn.datatasks import preprocessors as pp
from cairn.datatasks import stateless_numpy as sn
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.preprocessors.seeded_numpy import example_seeds
from cairn.datatasks.ragged import Ragged
from cairn.tokenizers import ByteVocabulary

LENGTHS = {"inputs": 48, "targets": 16}
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]


def write_sources(data_dir: str) -> None:
    root = pathlib.Path(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    specs = {"a0.txt": (0, 150), "a1.txt": (1, 130), "b0.txt": (2, 90)}
    for name, (salt, n) in specs.items():
        path = root / name
        if path.exists():
            continue
        lines = []
        for i in range(n):
            k = (i * 7 + salt * 3) % 23 + 1
            lines.append(" ".join(WORDS[(i + j * salt) % len(WORDS)] for j in range(k % 9 + 1)) + f" {salt}:{i}")
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def halves(ds):
    def fn(line):
        words = tf.strings.split(line)
        half = tf.size(words) // 2
        return {
            "inputs": tf.strings.reduce_join(words[:half], separator=" "),
            "targets": tf.strings.reduce_join(words[half:], separator=" "),
        }

    return ds.map(fn)


@dt.map_over_dataset(num_seeds=1)
def noise_tf(x, seed):
    """Replaces ~10% of the input ids with random bytes (length-preserving)."""
    v = x["inputs"]
    flip = tf.random.stateless_uniform(tf.shape(v), seed) < 0.1
    rnd = tf.random.stateless_uniform(tf.shape(v), seed + 1, 3, 259, dtype=tf.int32)
    return {**x, "inputs": tf.where(flip, rnd, v)}


def _same_lengths(lengths, sequence_length, output_features):
    return lengths


noise_tf.deterministic_lengths = _same_lengths


def _noise_numpy(features, sequence_length, output_features, seed=None):
    """`noise_tf` on a batch of examples (each example's own seed `[N, 2]`), bit for bit."""
    v = features["inputs"]
    seeds = example_seeds(seed, 1)[:, 0]  # what map_over_dataset hands each record's `fn`
    flip = sn.words_to_float32(sn.ragged_words(seeds, v.lengths)) < np.float32(0.1)
    with np.errstate(over="ignore"):
        words = sn.ragged_words(seeds + np.int32(1), v.lengths)
    rnd = (np.uint32(3) + words % np.uint32(256)).astype(v.values.dtype)
    return {**features, "inputs": Ragged(np.where(flip, rnd, v.values), v.lengths)}


noise = pp.preprocessor(deterministic=False, output_lengths=_same_lengths, numpy_fn=_noise_numpy)(noise_tf)


def make(data_dir: str, registry: dt.Registry, extra_ids: int = 0, noisy: bool = True, tf_noise: bool = False):
    write_sources(data_dir)
    vocab = ByteVocabulary(extra_ids=extra_ids)
    feats = {"inputs": dt.Feature(vocab), "targets": dt.Feature(vocab)}
    post = [noise_tf if tf_noise else noise] if noisy else []
    tasks = []
    for name, pattern in (("det_a", "a*.txt"), ("det_b", "b*.txt")):
        task = dt.Task(
            name,
            dt.TextLineDataSource({"train": os.path.join(data_dir, pattern)}),
            feats,
            [halves, pp.tokenize, *post, pp.append_eos_after_trim],
        )
        tasks.append(registry.add_task(task))
    mix = registry.add_mixture(dt.Mixture("det_mix", [("det_a", 2.0), ("det_b", 1.0)], registry=registry))
    return tasks[0], tasks[1], mix
