"""One process of fingerprint_multiprocess_test.py (not run by pytest).

usage: fingerprint_worker.py NUM_PROCESSES PROCESS_ID PORT LOCAL_DEVICES MODEL_DIR
Builds global params sharded over all 8 devices (of 1 or 2 processes) and runs the fingerprint's
header and step hook on every process.
"""

import os
import sys

num_processes, process_id, port, local_devices = map(int, sys.argv[1:5])
model_dir = sys.argv[5]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={local_devices}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from cairn.launchers.fingerprint import RunFingerprint  # noqa: E402
from cairn.partitioning import create_mesh, initialize_distributed  # noqa: E402

initialize_distributed(
    f"127.0.0.1:{port}",
    num_processes,
    process_id,
    coordinator_bind_address=f"127.0.0.1:{port}",
    initialization_timeout=60,
)
assert jax.process_count() == num_processes and jax.device_count() == 8

mesh = create_mesh({"data": 4, "model": 2})
P, S = jax.sharding.PartitionSpec, jax.sharding.NamedSharding
rng = np.random.default_rng(0)
host = {
    "dense": {"kernel": rng.standard_normal((16, 8), dtype=np.float32)},
    "embed": rng.standard_normal((8, 4)).astype(jnp.bfloat16),
    "scale": np.linspace(-1, 1, 4, dtype=np.float32),
}
specs = {"dense": {"kernel": P("data", "model")}, "embed": P("model", None), "scale": P()}
params = jax.tree.map(
    lambda v, spec: jax.make_array_from_callback(v.shape, S(mesh, spec), lambda idx: v[idx]), host, specs
)
assert params["dense"]["kernel"].is_fully_addressable == (num_processes == 1)


class State:
    pass


state = State()
state.params = params
fp = RunFingerprint(model_dir, checksum_every=2)
fp.write_header(
    config_hash="c",
    data_fingerprint="d",
    seed=0,
    process_count=jax.process_count(),
    device_count=jax.device_count(),
    mesh=dict(mesh.shape),
)
for step in (1, 2, 3, 4):
    fp.step_hook(step, state)
    state.params = jax.tree.map(lambda x: x * 2, state.params)
if num_processes > 1:
    jax.distributed.shutdown()
print("worker done", process_id)
