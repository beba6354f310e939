"""orbax's jax.Array writes (cairn.trainer.replica_writes): on one process a checkpoint of
replicated arrays compiles nothing (no slice per replica and array shape), and restores exactly."""

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from cairn.trainer.checkpoints import Checkpointer
from cairn.trainer.replica_writes import configure_array_writes


def test_one_process_writes_replicated_arrays_whole_and_compiles_nothing(tmp_path):
    assert jax.process_count() == 1 and jax.device_count() == 8
    Checkpointer(str(tmp_path / "run"))  # a Checkpointer configures the handler
    handler = ocp.type_handlers.get_type_handler(jax.Array)
    assert handler._use_replica_parallel is False

    mesh = jax.make_mesh((8,), ("data",))
    replicated = NamedSharding(mesh, P())
    rng = np.random.default_rng(0)
    tree = {f"w{i}": jax.device_put(rng.normal(size=(8 + i, 16)).astype(np.float32), replicated) for i in range(12)}
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: compiles.append(event) if "backend_compile" in event else None
    )
    manager = ocp.CheckpointManager(
        tmp_path / "ckpt", options=ocp.CheckpointManagerOptions(create=True), item_names=("state",)
    )
    manager.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(tree)))
    manager.wait_until_finished()
    assert compiles == [], compiles  # replica-parallel saving compiled a slice per array and replica
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), tree)
    restored = manager.restore(1, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
    for k, v in tree.items():
        np.testing.assert_array_equal(np.asarray(restored[k]), np.asarray(v))
        assert restored[k].sharding == v.sharding
    manager.close()


def test_the_metadata_store_of_the_default_handler_is_kept():
    before = ocp.type_handlers.get_type_handler(jax.Array)._array_metadata_store
    assert before is not None
    configure_array_writes()
    assert ocp.type_handlers.get_type_handler(jax.Array)._array_metadata_store is before
