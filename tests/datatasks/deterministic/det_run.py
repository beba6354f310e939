"""Runs a deterministic reader and prints per-step SHA-256 digests as JSON (for tests).

python det_run.py DATA_DIR CACHE_DIR NAME PACK STEPS [HOST_INDEX HOST_COUNT BATCH]

Without a host: `{"run": run(...), "tensorflow_imported": ...}` (the tasks' `noise` runs in
NumPy, so reading imports no TensorFlow). With a host: this host's share of each global batch
of BATCH rows, read by the tasks without their noise, as one digest per row.
"""

import hashlib
import json
import sys

import det_tasks

import cairn.datatasks as dt
from cairn.datatasks.deterministic import DeterministicReader


def digest(batch) -> str:
    h = hashlib.sha256()
    for k in sorted(batch):
        h.update(k.encode())
        h.update(str(batch[k].dtype).encode() + str(batch[k].shape).encode())
        h.update(batch[k].tobytes())
    return h.hexdigest()


def row_digests(batch) -> list:
    """One digest per row of `batch` (its features' values in that row)."""
    rows = len(next(iter(batch.values())))
    return [digest({k: v[i] for k, v in batch.items()}) for i in range(rows)]


def reader(data_dir, cache_dir, name, pack, host_index=0, host_count=1, batch=4, noisy=True, tf_noise=False, **kwargs):
    registry = dt.Registry()
    det_tasks.make(data_dir, registry, noisy=noisy, tf_noise=tf_noise)
    return DeterministicReader(
        name,
        cache_dir,
        seed=7,
        global_batch_size=batch,
        sequence_length=det_tasks.LENGTHS,
        feature_converter=dt.EncDecFeatureConverter(pack=pack),
        host_index=host_index,
        host_count=host_count,
        registry=registry,
        **kwargs,
    )


def run(r, steps: int) -> list:
    """`[{"state", "digest"}]` of the next `steps` batches of reader `r`."""
    out = []
    for _ in range(steps):
        state = r.get_state()
        out.append({"state": state, "digest": digest(next(r))})
    return out


def main(argv):
    data_dir, cache_dir, name, pack, steps = argv[:5]
    if len(argv) > 5:
        host, count, batch = (int(a) for a in argv[5:8])
        r = reader(data_dir, cache_dir, name, pack == "1", host, count, batch, noisy=False)
        print(json.dumps([row_digests(next(r)) for _ in range(int(steps))]))
        return
    r = reader(data_dir, cache_dir, name, pack == "1")
    print(json.dumps({"run": run(r, int(steps)), "tensorflow_imported": "tensorflow" in sys.modules}))


if __name__ == "__main__":
    main(sys.argv[1:])
