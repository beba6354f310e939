"""One process of consistency_test.py (not collected by pytest).

usage: consistency_worker.py NUM_PROCESSES PROCESS_ID PORT LOCAL_DEVICES MODEL OUT_JSON
On a mesh model=MODEL, data=rest, gathers the row digests of a fixed global batch twice: with
this host's DataLayout rows (writes the global batch fingerprint or the error), then with rows
chosen by the process id, as a reader that ignores the mesh would (writes the error or the
fingerprint, as `wrong_...`). `global_batch` and `fingerprint` are imported by the test for the
one-process reference.
"""

import json
import os
import sys

import numpy as np

ROWS = 16


def global_batch() -> dict:
    rows = np.arange(ROWS * 6, dtype=np.int32).reshape(ROWS, 6)
    return {"targets": rows, "weights": (rows % 3).astype(np.float32)}


def fingerprint(local: dict, layout, step: int = 7) -> dict:
    """{"fingerprint": ...} of the gathered digests, or {"error": ...} if replicas disagree."""
    from cairn.partitioning import ReplicaBatchMismatchError, check_replica_batches

    try:
        return {"fingerprint": check_replica_batches(local, layout, step=step).fingerprint()}
    except ReplicaBatchMismatchError as e:
        return {"error": str(e)}


def main() -> None:
    num_processes, process_id, port, local_devices, model = map(int, sys.argv[1:6])
    out_json = sys.argv[6]
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={local_devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"

    from cairn.partitioning import Partitioner, create_mesh, initialize_distributed, standard_logical_axis_rules

    if num_processes > 1:
        initialize_distributed(
            f"127.0.0.1:{port}",
            num_processes,
            process_id,
            coordinator_bind_address=f"127.0.0.1:{port}",
            initialization_timeout=60,
        )
    partitioner = Partitioner(create_mesh({"data": -1, "fsdp": 1, "model": model}), standard_logical_axis_rules())
    layout = partitioner.data_layout()
    batch = global_batch()
    right = layout.host_rows(ROWS)
    per = ROWS // num_processes
    wrong = slice(process_id * per, (process_id + 1) * per)
    out = {"shard_id": layout.shard_id, "num_shards": layout.num_shards}
    out.update(fingerprint({k: v[right] for k, v in batch.items()}, layout))
    out.update({f"wrong_{k}": v for k, v in fingerprint({k: v[wrong] for k, v in batch.items()}, layout).items()})
    with open(out_json, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
