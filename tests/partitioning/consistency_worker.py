"""One process of consistency_test.py (not collected by pytest).

usage: consistency_worker.py NUM_PROCESSES PROCESS_ID PORT LOCAL_DEVICES MODEL OUT_JSON [wrong]
On a mesh model=MODEL, data=rest, feeds this host's DataLayout rows of a fixed global batch
(or, with `wrong`, rows chosen by the process id, as a reader that ignores the mesh would),
then gathers the row digests: writes the global batch fingerprint or the error.
"""

import json
import os
import sys

num_processes, process_id, port, local_devices, model = map(int, sys.argv[1:6])
out_json = sys.argv[6]
wrong = len(sys.argv) > 7 and sys.argv[7] == "wrong"
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={local_devices}"
os.environ["JAX_PLATFORMS"] = "cpu"

import numpy as np  # noqa: E402

from cairn.partitioning import (  # noqa: E402
    Partitioner,
    ReplicaBatchMismatchError,
    check_replica_batches,
    create_mesh,
    initialize_distributed,
    standard_logical_axis_rules,
)

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
rows = np.arange(16 * 6, dtype=np.int32).reshape(16, 6)
global_batch = {"targets": rows, "weights": (rows % 3).astype(np.float32)}
if wrong:
    per = 16 // num_processes
    chosen = slice(process_id * per, (process_id + 1) * per)
else:
    chosen = layout.host_rows(16)
local = {k: v[chosen] for k, v in global_batch.items()}
out = {"shard_id": layout.shard_id, "num_shards": layout.num_shards}
try:
    out["fingerprint"] = check_replica_batches(local, layout, step=7).fingerprint()
except ReplicaBatchMismatchError as e:
    out["error"] = str(e)
with open(out_json, "w") as f:
    json.dump(out, f)
