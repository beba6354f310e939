"""Grain 0.2.18 over the shards of a Cairn task cache: deterministic_bench.py's second peer.

    .peer-venv/bin/python benchmarks/_grain_peer.py --task-dir CACHE/det_bench/train \
        [--modes unpacked,packed_mp2,packed_mp0] [--batches 200] [--unpacked-batches 2000]

Reads the ArrayRecord shards `cache_tasks` wrote (one serialized `tf.train.Example` per
record, flat int64 lists) with `grain.MapDataset.source(ArrayRecordDataSource(shards))`,
a global `.shuffle(seed)` (reshuffled every epoch by `.repeat()`), and a map that parses
`inputs`/`targets` into int32 arrays and does `append_eos_after_trim`'s work (cut to
length - 1, append EOS). Then EncDecFeatureConverter's work:

  * unpacked: pad to 512/128 in the same map, `to_iter_dataset(ReadOptions(num_threads=0))`,
    `.batch(32)`, and a batched map: decoder_input_tokens (targets shifted right, BOS 0),
    decoder_loss_weights (targets != 0); the four features int32, as Cairn's.
  * packed: `FirstFitPackIterDataset(length_struct={"inputs": 512, "targets": 128},
    num_packing_bins=32, seed)`, `.batch(32)`, a batched map making the eight features
    (decoder inputs restart with BOS at every segment, as cairn.datatasks.packing's), then
    `.mp_prefetch(MultiprocessingOptions(num_workers=W))` for W > 0.

Modes: `unpacked`, `packed_mp<W>` (W worker processes; 0 = all in this process). Each mode
runs in a fresh process (so its peak RSS is its own). The records are parsed with protobuf
directly (the `tf.train.Example` schema built here from its descriptor), so no TensorFlow is
imported: what a Grain user without TF pays. The last line of stdout is JSON:
`{mode: {batches_per_s, tokens_per_s (non-pad target tokens), fill (non-pad target tokens /
(batch x 128)), rss_*_mb, ...}}`; rates are the median of `--repeats` timed windows.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _reader_measure import TreeRss, max_rss_mb, measure, rss_report


def example_class():
    """`tensorflow.Example` as a protobuf message class, without importing TensorFlow."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="bench_example.proto", package="tensorflow", syntax="proto3")

    def msg(name, *fields, parent=None):
        m = (parent.nested_type if parent else f.message_type).add(name=name)
        for number, (fname, ftype, label, type_name) in enumerate(fields, 1):
            fd = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                fd.type_name = type_name
        return m

    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    msg("BytesList", ("value", F.TYPE_BYTES, rep, None))
    msg("FloatList", ("value", F.TYPE_FLOAT, rep, None))
    msg("Int64List", ("value", F.TYPE_INT64, rep, None))
    feat = msg(
        "Feature",
        ("bytes_list", F.TYPE_MESSAGE, opt, ".tensorflow.BytesList"),
        ("float_list", F.TYPE_MESSAGE, opt, ".tensorflow.FloatList"),
        ("int64_list", F.TYPE_MESSAGE, opt, ".tensorflow.Int64List"),
    )
    feat.oneof_decl.add(name="kind")
    for fd in feat.field:
        fd.oneof_index = 0
    feats = msg("Features", ("feature", F.TYPE_MESSAGE, rep, ".tensorflow.Features.FeatureEntry"))
    entry = msg(
        "FeatureEntry",
        ("key", F.TYPE_STRING, opt, None),
        ("value", F.TYPE_MESSAGE, opt, ".tensorflow.Feature"),
        parent=feats,
    )
    entry.options.map_entry = True
    msg("Example", ("features", F.TYPE_MESSAGE, opt, ".tensorflow.Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


class ParseTrimEos:
    """Record bytes -> {inputs, targets} int32: cut to length - 1, EOS appended (Cairn's
    `append_eos_after_trim`); with `pad`, also zero-padded to the length (the unpacked
    converter's trim-and-pad)."""

    def __init__(self, lengths: dict, eos_id: int, pad: bool):
        self.lengths, self.eos, self.pad = lengths, eos_id, pad
        self.example = None

    def __call__(self, record: bytes) -> dict:
        if self.example is None:  # built lazily: the map is pickled into worker processes
            self.example = example_class()
        feature = self.example.FromString(record).features.feature
        out = {}
        for k, n in self.lengths.items():
            values = feature[k].int64_list.value
            m = min(len(values), n - 1)
            v = np.zeros(n if self.pad else m + 1, np.int32)
            v[:m] = values[:m]
            v[m] = self.eos
            out[k] = v
        return out


def shift_right(x: np.ndarray) -> np.ndarray:
    out = np.zeros_like(x)
    out[:, 1:] = x[:, :-1]
    return out


def convert_unpacked(b: dict) -> dict:
    t = b["targets"]
    return {
        "encoder_input_tokens": b["inputs"],
        "decoder_target_tokens": t,
        "decoder_input_tokens": shift_right(t),
        "decoder_loss_weights": (t != 0).astype(np.int32),
    }


def convert_packed(b: dict) -> dict:
    out = convert_unpacked(b)
    seg = b["targets_segment_ids"]
    first = seg != shift_right(seg)  # a segment's first token (and padding after a segment)
    out["decoder_input_tokens"] = np.where(first, 0, out["decoder_input_tokens"]).astype(np.int32)
    out.update(
        encoder_segment_ids=b["inputs_segment_ids"],
        decoder_segment_ids=seg,
        encoder_positions=b["inputs_positions"],
        decoder_positions=b["targets_positions"],
    )
    return {k: np.asarray(v, np.int32) for k, v in out.items()}


def pipeline(shards: list, mode: str, lengths: dict, batch: int, eos_id: int, seed: int):
    import grain

    pack = mode.startswith("packed")
    ds = (
        grain.MapDataset.source(grain.sources.ArrayRecordDataSource(shards))
        .shuffle(seed=seed)
        .repeat()
        .map(ParseTrimEos(lengths, eos_id, pad=not pack))
    )
    it = ds.to_iter_dataset(grain.ReadOptions(num_threads=0))
    if not pack:
        return it.batch(batch).map(convert_unpacked)
    it = grain.experimental.FirstFitPackIterDataset(it, length_struct=dict(lengths), num_packing_bins=batch, seed=seed)
    it = it.batch(batch).map(convert_packed)
    workers = int(mode.removeprefix("packed_mp"))
    if workers:
        it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    return it


def run_mode(args) -> dict:
    lengths = {"inputs": args.inputs_len, "targets": args.targets_len}
    shards = sorted(glob.glob(os.path.join(args.task_dir, "*.array_record")))
    if not shards:
        raise SystemExit(f"no *.array_record in {args.task_dir}")
    import grain  # noqa: F401  (the imports are not the pipeline's memory)
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # Grain reads its absl flags (defaults) in mp_prefetch

    base = max_rss_mb()
    sampler = TreeRss()
    it = iter(pipeline(shards, args.mode, lengths, args.batch, args.eos_id, args.seed))
    batches = args.unpacked_batches if args.mode == "unpacked" else args.batches
    out = measure(it, batches, args.warmup, args.repeats, args.targets_len)
    tree = sampler.stop()
    if hasattr(it, "close"):
        it.close()  # joins the worker processes, so RUSAGE_CHILDREN counts them
    out.update(rss_report(base, tree))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task-dir", required=True, help="<cache>/<task>/<split> of cache_tasks")
    p.add_argument("--modes", default="unpacked,packed_mp2,packed_mp0")
    p.add_argument("--mode", help="internal: measure this one mode in this process")
    p.add_argument("--inputs-len", type=int, default=512)
    p.add_argument("--targets-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--batches", type=int, default=200, help="packed batches per window")
    p.add_argument("--unpacked-batches", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3, help="timed windows (median)")
    p.add_argument("--eos-id", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args)))
        return
    out = {}
    for mode in args.modes.split(","):
        argv = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("modes", "mode")]
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), *argv, "--mode", mode], capture_output=True, text=True
        )
        out[mode] = (
            json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {"error": proc.stderr[-800:]}
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
