"""Reading only the params of a checkpoint (fine-tuning, upcycling): `restore_params` loads
them cast and sharded as asked, `stored_params` gives their shapes and dtypes from the metadata."""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from cairn import storage
from cairn.trainer.checkpoints import CHECKPOINT_DIR, NoCheckpointError


def _step_dir(path: str | os.PathLike, step: int | None) -> Any:
    """The step folder (holding `state`) of a model_dir, its `checkpoints` folder or a step folder."""
    root = storage.path(path)
    if (root / CHECKPOINT_DIR).is_dir():
        root = root / CHECKPOINT_DIR
    if not (root / "state").is_dir():
        steps = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.is_dir() else []
        if step is None and not steps:
            raise NoCheckpointError(f"no checkpoint in {root}")
        root = root / str(step if step is not None else steps[-1])
    return root


def restore_params(path: str | os.PathLike, abstract_params: Any, step: int | None = None) -> Any:
    """Only the params of a checkpoint (a model_dir, its `checkpoints` folder, or one step's
    folder), cast and sharded as `abstract_params` (ShapeDtypeStructs with shardings) says.
    For fine-tuning from a pretrained run."""
    root = _step_dir(path, step)
    item = {"params": abstract_params}
    restore_args = ocp.checkpoint_utils.construct_restore_args(item)
    with ocp.PyTreeCheckpointer() as ckptr:
        out = ckptr.restore(
            root / "state", args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True)
        )
    return out["params"]


def stored_params(path: str | os.PathLike, step: int | None = None) -> Any:
    """The params a checkpoint holds (located as by `restore_params`) as `jax.ShapeDtypeStruct`s,
    read from its metadata (nothing loaded)."""
    with ocp.PyTreeCheckpointer() as ckptr:
        tree = ckptr.metadata(_step_dir(path, step) / "state").item_metadata.tree
    return jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), tree["params"], is_leaf=lambda m: hasattr(m, "shape")
    )
