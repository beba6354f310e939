"""Checkpointable data iterators: JSON-able state dicts, or tf.data iterators via tf.train.Checkpoint."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import jax

from cairn import storage

TF_DATA_DIR = "tf_data"


def is_tf_iterator(data: Any) -> bool:
    """A tf.data iterator (checked without importing TensorFlow)."""
    return type(data).__module__.startswith("tensorflow") and hasattr(data, "__next__")


class TfDataIterator:
    """Wraps a `tf.data` iterator so the trainer can checkpoint it: `get_state()` writes a
    `tf.train.Checkpoint` of the iterator to `<model_dir>/tf_data/<position>/process_<i>/` and returns
    `{"position", "tf_checkpoint"}` (a folder relative to model_dir); `set_state` restores this
    host's iterator from it. Resuming needs the same number of hosts (tf.data state is per host).
    Batches come out as numpy. Checkpoints for positions older than the last `keep` are deleted.
    TensorFlow writes these files itself, so a `gs://` model_dir reaches them through
    TensorFlow's own GCS client (no emulator support; the deterministic reader, what pods use,
    keeps its state in the orbax checkpoint instead).
    """

    def __init__(self, iterator: Any, model_dir: str | os.PathLike, keep: int = 10):
        self.iterator = iterator
        self.model_dir = os.fspath(model_dir)
        self.keep = keep
        self.position = 0

    def __iter__(self) -> Iterator:
        return self

    def __next__(self) -> Mapping[str, Any]:
        batch = next(self.iterator)
        self.position += 1
        return {k: v.numpy() for k, v in batch.items()} if isinstance(batch, Mapping) else batch.numpy()

    def _checkpoint(self):
        import tensorflow as tf  # lazy: only for tf.data pipelines

        return tf.train.Checkpoint(iterator=self.iterator)

    def get_state(self) -> dict:
        rel = f"{TF_DATA_DIR}/{self.position}"
        target = storage.join(self.model_dir, rel, f"process_{jax.process_index()}")
        storage.remove_tree(target)
        self._checkpoint().write(storage.join(target, "iterator"))
        self._prune()
        # The same dict on every host (process 0 saves it); each host reads its own subfolder.
        return {"position": self.position, "tf_checkpoint": rel}

    def set_state(self, state: Mapping[str, Any]) -> None:
        path = storage.join(self.model_dir, state["tf_checkpoint"], f"process_{jax.process_index()}", "iterator")
        self._checkpoint().read(path).assert_consumed()
        self.position = int(state["position"])

    def _prune(self) -> None:
        root = storage.path(storage.join(self.model_dir, TF_DATA_DIR))
        positions = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.exists() else []
        for p in positions[: -self.keep]:
            storage.remove_tree(storage.join(os.fspath(root), str(p)))
