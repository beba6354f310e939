"""One process of the multi-host test (run by distributed_test.py, not by pytest).

usage: multihost_worker.py NUM_PROCESSES PROCESS_ID PORT LOCAL_DEVICES OUT_PREFIX
Computes a sharded matmul-and-reduce and three SGD steps of a 2-layer MLP on the mesh
data=2 x fsdp=2 x model=2 with the FSDP rules, feeding each host only its rows. The test runs
`run` in its own process (1 process x 8 devices) for the reference.
"""

import json
import os
import sys


def run(num_processes: int, process_id: int, port: int, out_prefix: str) -> None:
    """Writes `<out_prefix>.<process_id>.npz` (results) and `.json` (how the process saw it)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from cairn.partitioning import Partitioner, create_mesh, initialize_distributed, standard_logical_axis_rules

    config = initialize_distributed(
        f"127.0.0.1:{port}",
        num_processes,
        process_id,
        coordinator_bind_address=f"127.0.0.1:{port}",
        initialization_timeout=60,
    )
    assert jax.process_count() == num_processes and jax.device_count() == 8, (jax.process_count(), jax.device_count())

    partitioner = Partitioner(create_mesh({"data": 2, "fsdp": 2, "model": 2}), standard_logical_axis_rules(fsdp=True))
    rng = np.random.default_rng(0)
    batch = {
        "x": rng.standard_normal((16, 32), dtype=np.float32),
        "y": rng.standard_normal((16, 32), dtype=np.float32),
    }
    params = {
        "w1": rng.standard_normal((32, 64), dtype=np.float32) / 8,
        "w2": rng.standard_normal((64, 32), dtype=np.float32) / 8,
    }
    specs = {"w1": ("embed", "mlp"), "w2": ("mlp", "embed")}

    layout = partitioner.data_layout()
    rows = layout.host_rows(16)
    host_batch = {k: v[rows] for k, v in batch.items()}
    global_batch = partitioner.shard_batch(host_batch, ("batch", "embed"))
    param_sh = partitioner.shardings_for(specs, params)
    global_params = {
        k: jax.make_array_from_callback(v.shape, param_sh[k], lambda idx, v=v: v[idx]) for k, v in params.items()
    }
    replicated = jax.sharding.NamedSharding(partitioner.mesh, jax.sharding.PartitionSpec())

    def matmul_reduce(x, w):
        y = partitioner.with_sharding_constraint(jnp.tanh(x @ w), ("batch", "mlp"))
        return y.sum(axis=0), y.sum()

    def loss_fn(p, b):
        h = partitioner.with_sharding_constraint(jnp.tanh(b["x"] @ p["w1"]), ("batch", "mlp"))
        return jnp.mean((h @ p["w2"] - b["y"]) ** 2)

    def step(p, b):
        loss, grads = jax.value_and_grad(loss_fn)(p, b)
        return jax.tree.map(lambda a, g: a - 0.5 * g, p, grads), loss

    reduce_fn = partitioner.partition(matmul_reduce, out_shardings=(replicated, replicated))
    col_sums, total = reduce_fn(global_batch["x"], global_params["w1"])
    step_fn = partitioner.partition(step, out_shardings=(param_sh, replicated))
    p = global_params
    losses = []
    for _ in range(3):
        p, loss = step_fn(p, global_batch)
        losses.append(np.asarray(loss))
    gather = partitioner.partition(lambda t: t, out_shardings=replicated)
    result = {
        "col_sums": np.asarray(col_sums),
        "total": np.asarray(total),
        "losses": np.stack(losses),
        "w1": np.asarray(gather(p["w1"])),
        "w2": np.asarray(gather(p["w2"])),
    }
    np.savez(f"{out_prefix}.{process_id}.npz", **result)
    # A hybrid mesh with one slice per process: every data row lies within one process (ICI),
    # the data axis crosses processes (DCN).
    hybrid = create_mesh({"data": 2, "fsdp": 2, "model": 2}, num_slices=num_processes)
    row_processes = [sorted({d.process_index for d in hybrid.devices[i].flat}) for i in range(2)]
    with open(f"{out_prefix}.{process_id}.json", "w") as f:
        json.dump(
            {
                "mode": config.mode,
                "shard_id": layout.shard_id,
                "num_shards": layout.num_shards,
                "w1_spec": str(p["w1"].sharding.spec),
                "local_devices": jax.local_device_count(),
                "hybrid_row_processes": row_processes,
            },
            f,
        )
    if num_processes > 1:
        jax.distributed.shutdown()


def main() -> None:
    num_processes, process_id, port, local_devices = map(int, sys.argv[1:5])
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={local_devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    run(num_processes, process_id, port, sys.argv[5])


if __name__ == "__main__":
    main()
