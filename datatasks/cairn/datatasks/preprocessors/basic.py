"""The everyday preprocessors: `rekey`, `tokenize`, `append_eos`, `append_eos_after_trim`, `trim`."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np

from cairn.datatasks.errors import FeatureTypeError
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.preprocessors import seeded_numpy
from cairn.datatasks.preprocessors.base import preprocessor
from cairn.datatasks.ragged import Ragged
from cairn.datatasks.stats import BadDataPolicy, DataStats
from cairn.datatasks.tf_data import map_inline, no_autograph
from cairn.tokenizers import ByteVocabulary, PassThroughVocabulary, SentencePieceVocabulary

_TOKENIZE_BATCH = 256


@preprocessor(deterministic=True)
def rekey(dataset: tf.data.Dataset, key_map: Mapping[str, str | None] | None = None) -> tf.data.Dataset:
    """Renames features: `{new: old}`; only the mapped features are kept (as in seqio).

    An empty or None `old` gives the empty string.
    """
    if not key_map:
        return dataset

    def fn(x):
        return {new: (x[old] if old else tf.constant("")) for new, old in key_map.items()}

    return map_inline(dataset, fn)


def _decode_all(flat: np.ndarray) -> tuple[list[str], np.ndarray]:
    """UTF-8 texts of `flat`; invalid bytes become U+FFFD and are flagged."""
    bad = np.zeros(len(flat), dtype=bool)
    try:
        return [raw.decode("utf-8") for raw in flat.tolist()], bad
    except UnicodeDecodeError:
        pass
    texts = []
    for j, raw in enumerate(flat.tolist()):
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            texts.append(raw.decode("utf-8", errors="replace"))
            bad[j] = True
    return texts, bad


def _encode_texts(
    vocab, flat: np.ndarray, stats: DataStats | None, feature: str, policy: BadDataPolicy
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ids of the texts `flat`. The invalid-UTF-8 policy (the same as the vocabularies' own
    `encode`, and seqio's): a vocabulary that encodes bytes gets the raw bytes of an invalid
    text (SentencePiece: its unknown id for each invalid byte; `ByteVocabulary`: the bytes
    as they are); any other gets the text with U+FFFD. Counted as `undecodable_replaced`
    (or, with `undecodable="skip"`, dropped and counted as `undecodable_skipped`)."""
    texts, bad = _decode_all(flat)
    inputs: list = texts
    if bad.any() and isinstance(vocab, (SentencePieceVocabulary, ByteVocabulary)):
        raw = flat.tolist()
        inputs = [raw[j] if bad[j] else t for j, t in enumerate(texts)]
    if isinstance(vocab, SentencePieceVocabulary):  # straight to the (sentinel-aware) model
        rows = vocab.tokenizer.encode(inputs, out_type=int, num_threads=1)
    elif hasattr(vocab, "encode_batch"):
        rows = vocab.encode_batch(inputs, num_threads=1)
    else:
        rows = [vocab.encode(t) for t in inputs]
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    values = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int32, count=int(lengths.sum()))
    if stats is not None and bad.any():
        reason = "undecodable_skipped" if policy.undecodable == "skip" else "undecodable_replaced"
        stats.add(reason, feature, int(bad.sum()))
    return values, lengths, bad


def _check_text_features(spec: Mapping[str, Any], output_features: Mapping[str, Any]) -> None:
    """A feature `tokenize` should encode but that is not text: a named error, unless the
    `Feature` says its values are token ids already (`token_ids=True`, or a vocabulary that
    passes ids through)."""
    for k, f in output_features.items():
        s = spec.get(k)
        if s is None or not hasattr(s, "dtype") or s.dtype == tf.string:
            continue
        if getattr(f, "token_ids", False) or isinstance(f.vocabulary, PassThroughVocabulary):
            continue
        rank = s.shape.rank
        what = "a scalar" if rank == 0 else f"a rank-{rank} tensor"
        raise FeatureTypeError(
            f"feature {k!r} is {what} of {s.dtype.name}, but its vocabulary "
            f"({type(f.vocabulary).__name__}) encodes text: give it strings, or declare "
            f"Feature(..., token_ids=True) if these are already token ids"
        )


def _tokenize_fn(keys, output_features, copy_pretokenized, with_eos, stats, policy, batched):
    def encode(x):
        out = dict(x)
        bad_any = None
        for k in keys:
            vocab = output_features[k].vocabulary
            v = x[k]
            flat = tf.reshape(v, [-1])

            def np_fn(f, vocab=vocab, k=k):
                return _encode_texts(vocab, f, stats, k, policy)

            values, lengths, bad = tf.numpy_function(np_fn, [flat], [tf.int32, tf.int64, tf.bool], stateful=False)
            values.set_shape([None])
            lengths.set_shape([None])
            bad.set_shape([None])
            ids = tf.RaggedTensor.from_row_lengths(values, lengths, validate=False)
            if with_eos and output_features[k].add_eos and vocab.eos_id is not None:
                eos = tf.fill([tf.shape(lengths)[0], 1], tf.constant(vocab.eos_id, tf.int32))
                ids = tf.concat([ids, eos], axis=1)
            if copy_pretokenized:
                out[f"{k}_pretokenized"] = v
            if batched:  # dense + lengths: unbatching RaggedTensors is slow in tf.data
                out[k] = ids.to_tensor()
                out[f"__len_{k}"] = ids.row_lengths()
            else:
                out[k] = ids.values
            bad = bad if batched else tf.reduce_any(bad)
            bad_any = bad if bad_any is None else tf.logical_or(bad_any, bad)
        if policy.undecodable == "skip":
            out["__undecodable__"] = bad_any
        return out

    return encode


@preprocessor(deterministic=True)
def tokenize(
    dataset: tf.data.Dataset,
    output_features: Mapping[str, Any],
    copy_pretokenized: bool = True,
    with_eos: bool = False,
    bad_data_policy: BadDataPolicy | None = None,
    stats: DataStats | None = None,
) -> tf.data.Dataset:
    """Encodes the string features named in `output_features` with their vocabularies.

    Keeps the text as `<name>_pretokenized` when `copy_pretokenized`. Invalid UTF-8 follows
    `bad_data_policy.undecodable` (encode the raw bytes by the vocabulary's rule, or skip;
    see `_encode_texts`) and is counted in `stats`. A feature of `output_features` that is
    present but not text raises `FeatureTypeError`, unless its `Feature` declares
    `token_ids=True` (or its vocabulary passes ids through).
    When every feature is a scalar, examples are encoded in batches of 256 (same result,
    fewer Python calls).
    """
    policy = bad_data_policy or BadDataPolicy()
    spec = dataset.element_spec
    _check_text_features(spec, output_features)
    keys = [k for k in output_features if k in spec and spec[k].dtype == tf.string]
    if not keys:
        return dataset
    scalar = all(isinstance(s, tf.TensorSpec) and s.shape.rank == 0 for s in spec.values())
    if scalar:
        fn = _tokenize_fn(keys, output_features, copy_pretokenized, with_eos, stats, policy, True)
        ds = map_inline(dataset.batch(_TOKENIZE_BATCH), fn).unbatch()

        @no_autograph
        def cut(x):
            out = {k: v for k, v in x.items() if not k.startswith("__len_")}
            for k in keys:
                out[k] = x[k][: x[f"__len_{k}"]]
            return out

        ds = map_inline(ds, cut)
    else:
        for k in keys:
            if spec[k].shape.rank != 0:
                raise ValueError(f"tokenize: feature {k!r} must be a scalar string, got shape {spec[k].shape}")
        fn = _tokenize_fn(keys, output_features, copy_pretokenized, with_eos, stats, policy, False)
        ds = map_inline(dataset, fn)
    if policy.undecodable == "skip":
        ds = ds.filter(lambda x: tf.logical_not(x["__undecodable__"]))
        ds = map_inline(ds, lambda x: {k: v for k, v in x.items() if k != "__undecodable__"})
    return ds


def _eos_keys(dataset, output_features):
    spec = dataset.element_spec
    keys = [k for k, f in output_features.items() if k in spec and f.add_eos and f.vocabulary.eos_id is not None]
    for k in keys:
        if getattr(spec[k], "shape", None) is not None and spec[k].shape.rank == 0:
            raise FeatureTypeError(
                f"feature {k!r} is a scalar of {spec[k].dtype.name}: EOS is appended to token "
                f"sequences (rank 1); tokenize it first (a text feature must be a string)"
            )
    return keys


# -- per-example output lengths (`Preprocessor.output_lengths`; packing plans use them) -----
def eos_after_trim_lengths(
    lengths: Mapping[str, np.ndarray], sequence_length: Mapping[str, int] | None, output_features: Mapping[str, Any]
) -> dict:
    """Lengths after `append_eos_after_trim` (and, with no `sequence_length`, `append_eos`)."""
    out = dict(lengths)
    for k, f in output_features.items():
        if k in out and f.add_eos and f.vocabulary.eos_id is not None:
            n = (sequence_length or {}).get(k)
            out[k] = (np.minimum(out[k], n - 1) if n is not None else out[k]) + 1
    return out


def eos_lengths(
    lengths: Mapping[str, np.ndarray], sequence_length: Mapping[str, int] | None, output_features: Mapping[str, Any]
) -> dict:
    """Lengths after `append_eos`."""
    return eos_after_trim_lengths(lengths, None, output_features)


def trim_lengths(
    lengths: Mapping[str, np.ndarray],
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, Any] | None = None,
) -> dict:
    """Lengths after `trim` (each feature cut to its sequence length)."""
    return {k: (np.minimum(v, sequence_length[k]) if sequence_length.get(k) else v) for k, v in lengths.items()}


# -- the same work on a batch of examples in NumPy (`Preprocessor.numpy_fn`) -----------------
def _eos_numpy(
    features: Mapping[str, Ragged], sequence_length: Mapping[str, int] | None, output_features: Mapping[str, Any]
) -> dict[str, Ragged]:
    out = dict(features)
    for k, f in output_features.items():
        if k in out and f.add_eos and f.vocabulary.eos_id is not None:
            n = (sequence_length or {}).get(k)
            r = out[k] if n is None else out[k].head(max(n - 1, 0))
            out[k] = r.append(f.vocabulary.eos_id)
    return out


def _append_eos_numpy(features, sequence_length, output_features) -> dict[str, Ragged]:
    return _eos_numpy(features, None, output_features)


def _trim_numpy(features, sequence_length, output_features) -> dict[str, Ragged]:
    return {k: (r.head(sequence_length[k]) if sequence_length.get(k) is not None else r) for k, r in features.items()}


@preprocessor(deterministic=True, output_lengths=eos_lengths, numpy_fn=_append_eos_numpy)
def append_eos(dataset: tf.data.Dataset, output_features: Mapping[str, Any]) -> tf.data.Dataset:
    """Appends EOS to every feature whose `Feature.add_eos` is set."""
    keys = _eos_keys(dataset, output_features)

    def fn(x):
        x = dict(x)
        for k in keys:
            eos = tf.constant([output_features[k].vocabulary.eos_id], x[k].dtype)
            x[k] = tf.concat([x[k], eos], axis=-1)
        return x

    return map_inline(dataset, fn)


@preprocessor(deterministic=True, output_lengths=eos_after_trim_lengths, numpy_fn=_eos_numpy)
def append_eos_after_trim(
    dataset: tf.data.Dataset, output_features: Mapping[str, Any], sequence_length: Mapping[str, int] | None = None
) -> tf.data.Dataset:
    """Trims to `sequence_length - 1` and appends EOS, so the EOS survives the final trim."""
    keys = _eos_keys(dataset, output_features)

    @no_autograph
    def fn(x):
        x = dict(x)
        for k in keys:
            eos = tf.constant([output_features[k].vocabulary.eos_id], x[k].dtype)
            v = x[k]
            if sequence_length is not None and sequence_length.get(k) is not None:
                v = v[..., : sequence_length[k] - 1]
            x[k] = tf.concat([v, eos], axis=-1)
        return x

    return map_inline(dataset, fn)


@preprocessor(deterministic=True, output_lengths=trim_lengths, numpy_fn=_trim_numpy)
def trim(dataset: tf.data.Dataset, sequence_length: Mapping[str, int]) -> tf.data.Dataset:
    """Trims each feature named in `sequence_length` to that length (first axis)."""

    def fn(x):
        return {
            k: (v[: sequence_length[k]] if sequence_length.get(k) is not None and v.shape.rank else v)
            for k, v in x.items()
        }

    return map_inline(dataset, fn)


def _random_crop_lengths(lengths, sequence_length, output_features, feature_key="targets"):
    feature = output_features.get(feature_key)
    eos = 1 if feature is not None and feature.add_eos else 0
    out = dict(lengths)
    out[feature_key] = np.minimum(np.asarray(lengths[feature_key]), int(sequence_length[feature_key]) - eos).astype(
        np.int32
    )
    return out


@preprocessor(deterministic=False, output_lengths=_random_crop_lengths, numpy_fn=seeded_numpy.random_crop)
def random_crop(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, Any],
    feature_key: str = "targets",
    seed: Any = None,
) -> tf.data.Dataset:
    """One-to-one: a seeded random window of `feature_key` that fits its sequence length
    (minus one for EOS when the feature adds one). Shorter examples pass unchanged. Usable
    after a deterministic cache of long fixed-length chunks (a language-model stream)."""
    from cairn.datatasks.preprocessors.base import map_over_dataset

    feature = output_features.get(feature_key)
    eos = 1 if feature is not None and feature.add_eos else 0
    keep = int(sequence_length[feature_key]) - eos

    @map_over_dataset(num_seeds=1)
    def crop(x, seed):
        tokens = x[feature_key]
        room = tf.maximum(tf.shape(tokens)[0] - keep, 0)
        start = tf.random.stateless_uniform([], seed, maxval=room + 1, dtype=tf.int32)
        out = dict(x)
        out[feature_key] = tokens[start : start + keep]
        return out

    return crop(dataset, seed=seed)
