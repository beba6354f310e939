"""Runs a deterministic reader and prints per-step SHA-256 digests as JSON (for tests).

python det_run.py DATA_DIR CACHE_DIR NAME PACK STEPS [HOST_INDEX HOST_COUNT]
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


def reader(data_dir, cache_dir, name, pack, host_index=0, host_count=1, batch=4, **kwargs):
    registry = dt.Registry()
    det_tasks.make(data_dir, registry)
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
    r = reader(data_dir, cache_dir, name, pack == "1")
    print(json.dumps(run(r, int(steps))))


if __name__ == "__main__":
    main(sys.argv[1:])
