"""One history per model_dir: when a run resumes from a checkpoint at step k (after a fallback
from a corrupt checkpoint, a full disk, a kill), the summaries written after step k by the
discarded timeline are moved aside to `<model_dir>/superseded/`, so that every reader of
`summaries/metrics.jsonl` (and of the TensorBoard event files) sees one value per step and
metric: the retrained one.

- `summaries/metrics.jsonl` (and, at a URL, its part objects): the rows after k move to
  `superseded/summaries/metrics.jsonl`, each with `"superseded_after_step": k`
  (`cairn.storage.supersede_after`).
- TensorBoard event files holding events after k: the original moves to
  `superseded/tensorboard/<task>/<file>` and is replaced by a copy without those events.

A start whose metrics end at or before k reads only the tail of `metrics.jsonl` (or its last
part): rows are appended in step order, and the event files are looked at only when rows moved.
"""

from __future__ import annotations

import io
import logging
import os
import struct

from cairn import storage

log = logging.getLogger(__name__)

SUPERSEDED_DIR = "superseded"
METRICS = ("summaries", "metrics.jsonl")
TENSORBOARD_DIR = "tensorboard"


def supersede_after(model_dir: str | os.PathLike, step: int) -> int:
    """Moves what model_dir's summaries hold after `step` to `<model_dir>/superseded/` (see the
    module docstring); returns the number of metric rows moved. Called by process 0 once the
    step to train from is known."""
    root = os.fspath(model_dir)
    moved = storage.supersede_after(storage.join(root, *METRICS), step, storage.join(root, SUPERSEDED_DIR, *METRICS))
    if moved:
        events = _supersede_events(root, step)
        log.info(
            "resuming at step %d: %d metric rows (%d TensorBoard events) after it, from the timeline this run "
            "replaces, moved to %s",
            step,
            moved,
            events,
            storage.join(root, SUPERSEDED_DIR),
        )
    return moved


def _supersede_events(root: str, step: int) -> int:
    """Event files with events after `step`: the original moved aside, a filtered copy in place."""
    base = storage.join(root, TENSORBOARD_DIR)
    dropped_total = 0
    for rel in storage.file_sizes(base):
        if ".tfevents." not in rel:
            continue
        path = storage.join(base, *rel.split("/"))
        data = storage.read_bytes(path)
        kept, dropped = _filter_events(data, step)
        if not dropped:
            continue
        storage.write_bytes(storage.join(root, SUPERSEDED_DIR, TENSORBOARD_DIR, *rel.split("/")), data)
        storage.write_bytes(path, kept)
        dropped_total += dropped
    return dropped_total


def _records(data: bytes):
    """The payloads of TFRecord framing (length, its CRC, payload, its CRC); a torn tail ends it."""
    offset = 0
    while offset + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        end = offset + 12 + length + 4
        if end > len(data):
            return
        yield data[offset + 12 : offset + 12 + length]
        offset = end


def _filter_events(data: bytes, step: int) -> tuple[bytes, int]:
    """`(file without the events after step, how many were dropped)`."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    out = io.BytesIO()
    writer = RecordWriter(out)
    dropped = 0
    for payload in _records(data):
        if event_pb2.Event.FromString(payload).step > step:
            dropped += 1
        else:
            writer.write(payload)
    writer.flush()
    return out.getvalue(), dropped
