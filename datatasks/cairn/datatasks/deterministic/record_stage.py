"""The cached records and the record stage of the deterministic reader: their NumPy and
TensorFlow forms side by side.

**The format.** A cache holds one `tf.train.Example` per example, serialized
deterministically (`serialize`): every feature stored flat (int64, float or bytes list), in
sorted order, numbers in packed lists; `info.json` keeps each feature's dtype and rank
(`FeatureSpec`) so `parse` gives back the arrays the preprocessors produced (rank <= 1).
`serialize`, `parse` and `specs_of` are the cache writer's and the checks' (TensorFlow's
protobuf classes).

**The record stage**: a task's cached records -> its examples (`{feature: Ragged}` in int32,
cut to their lengths), one record to one example. Two forms give the same examples:

* NumPy (`NumpyRecordStage`, no TensorFlow): `decode` reads the numeric features of the whole
  batch of records from the wire format at once, then each post-cache preprocessor's
  `numpy_fn` runs (`append_eos`, `append_eos_after_trim`, `trim`, and the seeded
  `random_crop` and `span_corruption_one_to_one` have one). A seeded preprocessor's `numpy_fn`
  gets each record's seed as the TensorFlow form makes it: the record's key `(epoch key,
  record id)` folded with the preprocessor's position in the task (`Task.preprocess`), by
  `stateless_numpy.fold_in`. The reader uses it whenever every post-cache preprocessor has a
  `numpy_fn`.
* TensorFlow (`RecordStage`, one `tf.function` traced once): records -> parsed -> the task's
  post-cache preprocessors, each record seeded by its own key when one is random -> trimmed
  features. Where the NumPy form cannot serve: a post-cache preprocessor without a
  `numpy_fn`, or records not in the cache's own layout (`WireFormatError`).

**Conversion's TensorFlow form** (`ConvertStage`): for converters without a NumPy
conversion (`FeatureConverter.converts_numpy` is False: a user's subclass, or passthrough
features; the library's converters convert in NumPy, `convert_numpy`). It takes the examples
as the NumPy conversion does (`{feature: Ragged}` and the row sizes) and builds its ragged
tensors from their flat values and lengths. Two ways, both giving the converter's own output
for each planned row: unpacked, the converter (pack=False) over the step's examples, one
`tf.data` pass; packed, the converter alone on each row's examples (the plan guarantees one
row).

TensorFlow is imported only when a TensorFlow form runs (`lazy_tf`): reading a cache through
the NumPy forms never imports it.

Wire format (protobuf), as `decode` reads it: a field's tag is `number << 3 | wire_type` (2:
length-delimited); Example{1: Features{1: map entry{1: key, 2: Feature{1: BytesList | 2:
FloatList | 3: Int64List{1: packed values}}}}}. Every record has the same features (one map
entry each, in the serializer's order). `decode` walks the entries of all records at once:
each length-delimited header is a vectorised varint read at one position per record, each
entry's name is matched against the cache's feature names, and each wanted feature's payload
(packed varints, or packed little-endian floats) is decoded in one pass over the batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from cairn.datatasks import stateless_numpy
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.feature_converters import FeatureConverter
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.preprocessors import as_preprocessor, is_deterministic
from cairn.datatasks.ragged import Ragged
from cairn.datatasks.tf_data import map_inline, pipeline_options

# -- the format: FeatureSpec, and the TensorFlow protobuf forms (the cache writer's) -------------
_FLOATS = frozenset({"bfloat16", "float16", "float32", "float64", "half", "float", "double"})


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """How one cached feature is stored: its dtype name and rank (0 or 1)."""

    dtype: str
    rank: int

    @property
    def kind(self) -> str:
        """The `tf.train.Feature` list it is stored in: "bytes", "float" or "int64"."""
        if self.dtype == "string":
            return "bytes"
        return "float" if self.dtype in _FLOATS else "int64"


def specs_of(element_spec: Mapping[str, tf.TensorSpec], task_name: str) -> dict[str, FeatureSpec]:
    """The cacheable features of a dataset's element spec (rank 0 or 1 only)."""
    out = {}
    for k, s in sorted(element_spec.items()):
        if not isinstance(s, tf.TensorSpec) or s.shape.rank not in (0, 1):
            raise DataTasksError(
                f"task {task_name!r}: cached feature {k!r} must be a dense "
                f"tensor of rank 0 or 1 after the cacheable preprocessors, "
                f"got {s}"
            )
        out[k] = FeatureSpec(s.dtype.name, int(s.shape.rank))
    return out


def serialize(example: Mapping[str, np.ndarray], specs: Mapping[str, FeatureSpec]) -> bytes:
    """Deterministic bytes for one example (sorted keys, `deterministic=True`)."""
    feature = {}
    for k in sorted(specs):
        v = np.asarray(example[k]).reshape(-1)
        kind = specs[k].kind
        if kind == "bytes":
            feature[k] = tf.train.Feature(bytes_list=tf.train.BytesList(value=list(v)))
        elif kind == "float":
            feature[k] = tf.train.Feature(float_list=tf.train.FloatList(value=v.tolist()))
        else:
            feature[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=v.tolist()))
    ex = tf.train.Example(features=tf.train.Features(feature=feature))
    return ex.SerializeToString(deterministic=True)


def parse(record: bytes, specs: Mapping[str, FeatureSpec], keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """One record back to `{name: array}` with the cached dtype and rank."""
    ex = tf.train.Example.FromString(record)
    out = {}
    for k in keys if keys is not None else sorted(specs):
        spec = specs[k]
        f = ex.features.feature[k]
        if spec.kind == "bytes":
            v = np.array(list(f.bytes_list.value), dtype=object)
        elif spec.kind == "float":
            v = np.array(f.float_list.value, dtype=spec.dtype)
        else:
            v = np.array(f.int64_list.value, dtype=spec.dtype)
        out[k] = v.reshape(()) if spec.rank == 0 else v
    return out


# -- NumPy decoding of the wire format -----------------------------------------------------------
_LIST_TAG = {"bytes": 0x0A, "float": 0x12, "int64": 0x1A}
_SHIFTS = (7 * np.arange(10, dtype=np.uint64)).astype(np.uint64)


class WireFormatError(DataTasksError):
    """A record is not laid out as `serialize` writes them."""


def _varints(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varint at each of `pos` in `buf` (padded with 10 zero bytes): (values, next positions)."""
    b0 = buf[pos]
    if (b0 < 0x80).all():  # one byte each: the common case of short headers
        return b0.astype(np.int64), pos + 1
    b1 = buf[pos + 1].astype(np.int64)
    if ((b0 < 0x80) | (b1 < 0x80)).all():
        two = b0 >= 0x80
        return (b0 & 0x7F).astype(np.int64) + np.where(two, b1 << 7, 0), pos + 1 + two
    b = buf[pos[:, None] + np.arange(10)]
    ends = b < 0x80
    n = ends.argmax(1) + 1
    if not ends.any(1).all():
        raise WireFormatError("malformed varint in a cached record")
    parts = (b.astype(np.uint64) & np.uint64(0x7F)) << _SHIFTS
    parts[np.arange(10)[None, :] >= n[:, None]] = 0
    return np.bitwise_or.reduce(parts, axis=1).view(np.int64), pos + n


def _expect(buf: np.ndarray, pos: np.ndarray, tag: int, what: str) -> np.ndarray:
    if pos.size and not (buf[pos] == tag).all():
        raise WireFormatError(f"cached record: expected {what}")
    return pos + 1


def _gather(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The bytes `buf[starts[i]:starts[i] + lengths[i]]` of every i, concatenated."""
    total = int(lengths.sum())
    idx = np.arange(total, dtype=np.int64) + np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
    return buf[idx]


def decode_packed_varints(data: np.ndarray, lengths: np.ndarray) -> Ragged:
    """Packed varint payloads (concatenated, `lengths` bytes each) -> int64 `Ragged`."""
    if data.size == 0:
        return Ragged(np.zeros(0, np.int64), np.zeros(lengths.size, np.int64))
    is_end = data < 0x80
    if not is_end[-1]:
        raise WireFormatError("truncated packed varints in a cached record")
    ends = np.flatnonzero(is_end)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    sizes = ends - starts + 1
    values = (data[starts] & 0x7F).astype(np.uint64)
    for j in range(1, int(sizes.max())):  # byte j of the varints that long (1-2 for token ids)
        more = np.flatnonzero(sizes > j)
        values[more] |= (data[starts[more] + j] & 0x7F).astype(np.uint64) << np.uint64(7 * j)
    values = values.view(np.int64)
    counts_before = np.zeros(data.size + 1, np.int64)
    np.cumsum(is_end, out=counts_before[1:])
    bounds = np.zeros(lengths.size + 1, np.int64)
    np.cumsum(lengths, out=bounds[1:])
    return Ragged(values, np.diff(counts_before[bounds]))


def _same_key(buf: np.ndarray, pos: np.ndarray, key_len: np.ndarray, end: np.ndarray, raw: bytes) -> np.ndarray:
    """Whether the key at `pos` (of length `key_len`, inside `end`) is `raw`, per record."""
    ok = (key_len == len(raw)) & (pos + len(raw) <= end)
    if ok.all():
        return (buf[pos[:, None] + np.arange(len(raw))] == np.frombuffer(raw, np.uint8)).all(1)
    which = np.flatnonzero(ok)
    ok[which] = (buf[pos[which, None] + np.arange(len(raw))] == np.frombuffer(raw, np.uint8)).all(1)
    return ok


def _feature_payload(
    buf: np.ndarray,
    pos: np.ndarray,
    entry_end: np.ndarray,
    name: str,
    spec: FeatureSpec,
    starts: np.ndarray,
    sizes: np.ndarray,
    which: np.ndarray,
) -> None:
    """Finds the packed payload of feature `name` in the map entries of records `which`
    (`pos`: just after the key) and writes its start and size into `starts`/`sizes`."""
    if spec.kind == "bytes":
        raise WireFormatError(f"feature {name!r} holds bytes; the NumPy path reads numbers only")
    pos = _expect(buf, pos, 0x12, "a Feature")
    _, pos = _varints(buf, pos)
    pos = _expect(buf, pos, _LIST_TAG[spec.kind], f"a {spec.kind} list")
    list_len, pos = _varints(buf, pos)
    if not np.array_equal(pos + list_len, entry_end):
        raise WireFormatError(f"cached record: feature {name!r} has fields after its list")
    payload = np.zeros(which.size, np.int64)
    has = list_len > 0
    if has.any():
        p = _expect(buf, pos[has], 0x0A, f"packed values of {name!r}")
        payload[has], p = _varints(buf, p)
        if not np.array_equal(p + payload[has], entry_end[has]):
            raise WireFormatError(f"cached record: feature {name!r} has fields after its values")
    if spec.kind == "float" and (payload % 4).any():
        raise WireFormatError(f"feature {name!r}: packed floats not a multiple of 4 bytes")
    starts[which] = entry_end - payload
    sizes[which] = payload


def decode(records: Sequence[bytes], specs: Mapping[str, FeatureSpec], keys: Sequence[str]) -> dict[str, Ragged]:
    """`{key: Ragged}` of the numeric features `keys` of `records` (cached dtype; a rank-0
    feature gives one value per record). Raises `WireFormatError` on another layout."""
    missing = [k for k in keys if k not in specs]
    if missing:
        raise DataTasksError(f"the cache has no feature {missing}; it has {sorted(specs)}")
    n = len(records)
    lengths = np.array(list(map(len, records)), np.int64)
    buf = np.frombuffer(b"".join(records) + bytes(10), np.uint8)
    pos = np.zeros(n, np.int64)
    np.cumsum(lengths[:-1], out=pos[1:])
    rec_end = pos + lengths
    out: dict[str, Ragged] = {}
    if n == 0:
        return {k: Ragged(np.zeros(0, specs[k].dtype), np.zeros(0, np.int64)) for k in keys}
    pos = _expect(buf, pos, 0x0A, "Example.features")
    size, pos = _varints(buf, pos)
    if not np.array_equal(pos + size, rec_end):
        raise WireFormatError("cached record: Example.features does not fill the record")
    wanted = sorted(set(keys))
    starts = {k: np.full(n, -1, np.int64) for k in wanted}  # payload start per record
    sizes = {k: np.zeros(n, np.int64) for k in wanted}
    names = sorted(specs)
    raws = [name.encode() for name in names]
    by_raw = dict(zip(raws, names))
    for _ in names:  # one map entry per feature; their order is the serializer's
        pos = _expect(buf, pos, 0x0A, "a feature map entry")
        size, pos = _varints(buf, pos)
        entry_end = pos + size
        pos = _expect(buf, pos, 0x0A, "a feature name")
        key_len, pos = _varints(buf, pos)
        first = bytes(buf[pos[0] : pos[0] + key_len[0]])
        if first in by_raw:  # usually every record has the same feature in this entry
            raw = first
            keys_here = [(by_raw[raw], raw, _same_key(buf, pos, key_len, entry_end, raw))]
            if not keys_here[0][2].all():
                keys_here = [(name, r, _same_key(buf, pos, key_len, entry_end, r)) for name, r in zip(names, raws)]
        else:
            keys_here = [(name, r, _same_key(buf, pos, key_len, entry_end, r)) for name, r in zip(names, raws)]
        found = np.zeros(n, bool)
        for name, raw, same in keys_here:
            which = np.flatnonzero(same)
            if which.size == 0:
                continue
            found[which] = True
            if name in starts:
                p, end = pos[which] + len(raw), entry_end[which]
                _feature_payload(buf, p, end, name, specs[name], starts[name], sizes[name], which)
        if not found.all():
            raise WireFormatError("cached record: a feature the cache's info.json does not name")
        pos = entry_end
    for k in wanted:
        if (starts[k] < 0).any():
            raise WireFormatError(f"cached record without feature {k!r}")
        data = _gather(buf, starts[k], sizes[k])
        if specs[k].kind == "float":
            r = Ragged(data.view("<f4").astype(specs[k].dtype), sizes[k] // 4)
        else:
            r = decode_packed_varints(data, sizes[k])
            r = Ragged(r.values.astype(specs[k].dtype), r.lengths)
        out[k] = r
    if not np.array_equal(pos, rec_end):
        raise WireFormatError("cached record: unexpected fields after the features")
    return out


# -- the record stage, NumPy form ----------------------------------------------------------------
class NumpyStep(NamedTuple):
    """One post-cache preprocessor on the NumPy path: its position in the task, its
    `numpy_fn`, and whether it is seeded (gets `seed=` per record)."""

    position: int
    fn: Callable
    seeded: bool


def numpy_fns(task: Any, start: int) -> list[NumpyStep] | None:
    """The NumPy steps of the task's preprocessors from `start` on; None when one lacks a `numpy_fn`."""
    steps = []
    for pos, p in list(enumerate(task.preprocessors))[start:]:
        pre = as_preprocessor(p)
        if pre.numpy_fn is None:
            return None
        steps.append(NumpyStep(pos, pre.numpy_fn, not pre.deterministic))
    return steps


class NumpyRecordStage:
    """Decodes and post-processes one task's records; `__call__` gives `{feature: Ragged}`."""

    def __init__(
        self,
        task: Any,
        specs: Mapping[str, FeatureSpec],
        fns: Sequence[NumpyStep],
        sequence_length: Mapping[str, int],
        keys: Sequence[str],
    ):
        self.task = task
        self.specs = dict(specs)
        self.fns = list(fns)
        self.lengths = dict(sequence_length)
        self.keys = list(keys)
        # Whether `__call__` needs the records' keys (a seeded preprocessor).
        self.seeded = any(step.seeded for step in self.fns)
        # Without post-cache work only the task features are decoded; else every numeric one.
        numeric = sorted(k for k, s in self.specs.items() if s.kind != "bytes")
        self.decode_keys = [k for k in self.keys if k in self.specs] if not self.fns else numeric

    def __call__(self, serialized: Sequence[bytes], keys: np.ndarray | None = None) -> dict[str, Ragged]:
        """The examples of `serialized`; `keys` `[N, 2]` are the records' `(epoch key,
        record id)`, needed when a preprocessor is seeded."""
        missing = [k for k in self.keys if k not in self.specs] if not self.fns else []
        if missing:
            raise DataTasksError(
                f"task {self.task.name!r}: the cache has no feature {missing}; it has {sorted(self.specs)}"
            )
        if self.seeded and (keys is None or np.shape(keys) != (len(serialized), 2)):
            raise DataTasksError(f"task {self.task.name!r}: seeded post-cache preprocessors need [N, 2] record keys")
        x = decode(serialized, self.specs, self.decode_keys)
        for step in self.fns:
            if step.seeded:  # Task.preprocess: stateless_fold_in(record key, position) (int32)
                seed = stateless_numpy.fold_in(np.asarray(keys, np.int64), step.position, np.int32)
                x = dict(step.fn(x, self.lengths, self.task.output_features, seed=seed))
            else:
                x = dict(step.fn(x, self.lengths, self.task.output_features))
        missing = [k for k in self.keys if k not in x]
        if missing:
            raise DataTasksError(
                f"task {self.task.name!r}: no feature {missing} after the post-cache "
                f"preprocessors; they give {sorted(x)}"
            )
        out = {}
        for k in self.keys:
            r = x[k].astype(np.int32)
            out[k] = r.head(self.lengths[k]) if k in self.lengths else r
        return out


# -- the record stage, TensorFlow form -----------------------------------------------------------
def _description(specs: Mapping[str, FeatureSpec]) -> dict:
    desc = {}
    for k, s in specs.items():
        dt = {"bytes": tf.string, "float": tf.float32, "int64": tf.int64}[s.kind]
        desc[k] = tf.io.FixedLenFeature([], dt) if s.rank == 0 else tf.io.RaggedFeature(dt)
    return desc


def _parse_fn(specs: Mapping[str, FeatureSpec]):
    desc = _description(specs)

    def parse(serialized):
        x = tf.io.parse_single_example(serialized, desc)
        return {k: tf.cast(v, specs[k].dtype) if specs[k].kind != "bytes" else v for k, v in x.items()}

    return parse


class RecordStage:
    """Parses and post-processes one task's records; returns `{feature: [arrays]}`.

    When every post-cache preprocessor is deterministic, they run once over the whole batch
    of records (fast), and with an unpacked `converter` the conversion runs in the same
    pass; otherwise each record runs alone, seeded by its own key.
    """

    def __init__(
        self,
        task: Any,
        specs: Mapping[str, FeatureSpec],
        start: int,
        sequence_length: Mapping[str, int],
        keys: Sequence[str],
        converter: FeatureConverter | None = None,
    ):
        self.task_name = task.name
        self.keys = list(keys)
        parse = _parse_fn(specs)
        lengths = dict(sequence_length)
        post = task.preprocessors[start:]
        self.per_record = not all(is_deterministic(p) for p in post)
        # Unpacked and batch-wide, with a converter that has no NumPy conversion: it runs in
        # the same pass (model features out).
        self.fused = (
            converter is not None and not converter.pack and not converter.converts_numpy and not self.per_record
        )

        def select(x):
            missing = [k for k in self.keys if k not in x]
            if missing:
                raise DataTasksError(
                    f"task {task.name!r}: no feature {missing} after the "
                    f"post-cache preprocessors; they give {sorted(x)}"
                )
            return {
                k: tf.cast(x[k], tf.int32)[: lengths[k]] if k in lengths else tf.cast(x[k], tf.int32) for k in self.keys
            }

        def one(i, serialized, key):
            ds = tf.data.Dataset.from_tensors(parse(serialized))
            ds = task.preprocess(ds, lengths, seed=key, start=start)
            return map_inline(ds, lambda x: (i, select(x)))

        def ragged(x):
            return {k: (v.values, v.row_lengths()) for k, v in x.items()}

        desc = _description(specs)
        post_keys = None if post else set(self.keys)

        def parse_all(serialized):
            x = tf.io.parse_example(serialized, {k: v for k, v in desc.items() if post_keys is None or k in post_keys})
            return {k: tf.cast(v, specs[k].dtype) if specs[k].kind != "bytes" else v for k, v in x.items()}

        def dense(e):  # ragged_rank-0 slices -> plain tensors
            return dict(e)

        def single(ds):  # with the options, so nested inline maps stay inline
            return ds.with_options(pipeline_options()).get_single_element()

        @tf.function(
            autograph=False, input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([None, 2], tf.int64)]
        )
        def run(serialized, keys):
            n = tf.shape(serialized)[0]
            n64 = tf.cast(n, tf.int64)
            if self.per_record:
                ds = tf.data.Dataset.from_tensor_slices((tf.range(n64), serialized, keys)).flat_map(one)
                idx, x = single(ds.ragged_batch(n64))
                return idx, ragged(x)
            x = parse_all(serialized)
            if not post:  # nothing after the cache: no per-example work at all
                missing = [k for k in self.keys if k not in x]
                if missing:
                    raise DataTasksError(
                        f"task {task.name!r}: the cache has no feature {missing}; it has {sorted(specs)}"
                    )
                out = {k: tf.cast(x[k], tf.int32) for k in self.keys}
                out = {k: (v[:, : lengths[k]] if k in lengths else v) for k, v in out.items()}
                if not self.fused:
                    return tf.range(n64), ragged(out)
                ds = map_inline(tf.data.Dataset.from_tensor_slices(out), dense)
            else:
                ds = map_inline(tf.data.Dataset.from_tensor_slices(x), dense)
                ds = map_inline(task.preprocess(ds, lengths, seed=None, start=start), select)
            if self.fused:
                out = single(converter(ds, lengths).batch(n64))
                return tf.range(tf.shape(next(iter(out.values())), tf.int64)[0]), out
            x = single(ds.ragged_batch(n64))
            return tf.range(tf.shape(x[self.keys[0]].row_lengths(), tf.int64)[0]), ragged(x)

        self._run = run

    def __call__(self, serialized: list[bytes], keys: np.ndarray) -> dict[str, Any]:
        """`{feature: Ragged}` (one row per record), or `{model feature: [records, L]}` if fused."""
        try:
            idx, out = self._run(tf.constant(serialized, tf.string), tf.constant(keys, tf.int64))
        except (tf.errors.InvalidArgumentError, KeyError) as e:
            raise DataTasksError(
                f"task {self.task_name!r}: reading cached records failed "
                f"(a post-cache preprocessor must keep the features "
                f"{self.keys}): {e}"
            ) from e
        if not np.array_equal(idx.numpy(), np.arange(len(serialized))):
            raise DataTasksError(
                f"task {self.task_name!r}: the post-cache preprocessors must map every record to exactly one example"
            )
        if self.fused:
            return {k: v.numpy() for k, v in out.items()}
        return {k: Ragged(values.numpy(), lengths.numpy().astype(np.int64)) for k, (values, lengths) in out.items()}


# -- conversion, TensorFlow form (converters without convert_numpy) ------------------------------
def _ragged(examples: Ragged, row_sizes: np.ndarray, nested: bool) -> tf.RaggedTensor:
    """The examples as a `[examples, None]` ragged tensor, or `[rows, None, None]` (`row_sizes`
    examples a row) when `nested`: built from the flat values and lengths as they are."""
    lengths = [np.asarray(examples.lengths, np.int64)]
    if nested:
        lengths.insert(0, np.asarray(row_sizes, np.int64))
    values = np.asarray(examples.values).astype(np.int32, copy=False)
    return tf.RaggedTensor.from_nested_row_lengths(values, lengths, validate=False)


class ConvertStage:
    """Converts this host's planned rows; `__call__` returns `{model feature: [rows, L]}`."""

    def __init__(
        self,
        converter: FeatureConverter,
        sequence_length: Mapping[str, int],
        keys: Sequence[str],
    ):
        self.keys = list(keys)
        lengths = dict(sequence_length)
        self.mode = "per_row" if converter.pack else "examples"
        ragged = tf.RaggedTensorSpec([None, None], tf.int32, ragged_rank=1)
        nested = tf.RaggedTensorSpec([None, None, None], tf.int32, ragged_rank=2)

        if self.mode == "examples":
            spec = {k: ragged for k in self.keys}

            def build(x):
                ds = map_inline(tf.data.Dataset.from_tensor_slices(x), lambda e: dict(e))
                return converter(ds, lengths)
        else:
            spec = {k: nested for k in self.keys}

            def one_row(row):
                ds = map_inline(tf.data.Dataset.from_tensor_slices(row), lambda e: dict(e))
                return converter(ds, lengths)

            def build(x):
                return tf.data.Dataset.from_tensor_slices(x).flat_map(one_row)

        @tf.function(autograph=False, input_signature=[spec])
        def run(x):
            n = tf.shape(next(iter(x.values())), out_type=tf.int64)[0]
            return build(x).batch(n).with_options(pipeline_options()).get_single_element()

        self._run = run

    def __call__(self, examples: Mapping[str, Ragged], row_sizes: np.ndarray) -> dict[str, np.ndarray]:
        """The model features of rows of examples: row `r` holds the next `row_sizes[r]`
        examples of `examples` (`{task feature: Ragged}`, as `FeatureConverter.convert_numpy`
        takes them; one a row unpacked)."""
        x = {k: _ragged(examples[k], row_sizes, nested=self.mode == "per_row") for k in self.keys}
        return {k: v.numpy() for k, v in self._run(x).items()}
