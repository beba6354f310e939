"""Params of a run's checkpoints for the eval and infer entry points: which steps are
complete, and the params of one, sharded on the mesh as the trainer lays them out."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from cairn import storage
from cairn.launchers import builder, run_setup
from cairn.launchers import data as data_lib
from cairn.launchers.run_spec import RunSpec
from cairn.launchers.validation import ConfigError


def checkpoint_root(path: str) -> str:
    """The `checkpoints/` folder of a model_dir (or `path` itself if it is one)."""
    inner = storage.join(path, "checkpoints")
    return inner if storage.path(inner).is_dir() else path


def complete_steps(path: str) -> list[int]:
    """Steps of finished checkpoints under a model_dir, ascending: a step folder whose manifest
    (`manifests/<step>.json`, written after the checkpoint completes) exists. A folder without
    a `manifests/` sibling (a copied checkpoints folder) counts every step folder with `state/`.
    `path` may be a URL; one listing of the folder's files (no reads)."""
    root = checkpoint_root(path)
    files = storage.file_sizes(root)
    steps = sorted(
        {
            int(name.split("/", 1)[0])
            for name in files
            if name.split("/", 1)[0].isdigit() and name.split("/")[1:2] == ["state"]
        }
    )
    manifests = storage.sizes(storage.join(os.fspath(storage.path(root).parent), "manifests"))
    if manifests:
        steps = [s for s in steps if f"{s}.json" in manifests]
    return steps


def zero_batch(spec: RunSpec, rows: int) -> dict[str, np.ndarray]:
    """A host batch of zeros with the model features and lengths of the spec's converter."""
    converter = data_lib.feature_converter(spec.reader)
    lengths = converter.get_model_feature_lengths(dict(spec.reader.sequence_length))
    return {k: np.zeros((rows, n), np.float32 if k.endswith("loss_weights") else np.int32) for k, n in lengths.items()}


@dataclasses.dataclass(frozen=True)
class ParamsLayout:
    """What a run's checkpoints hold (`params_layout`): `abstract`, the ShapeDtypeStructs (with
    shardings) of a checkpoint's params as the trainer lays them out (a LoRA run's: its
    adapters), and `to_model`, a checkpoint's params -> the model's (themselves; a LoRA run's
    adapters folded into its frozen base, `cairn.models.lora.merge`), and `base`, a LoRA run's
    frozen base params (None without LoRA)."""

    abstract: Any
    to_model: Callable[[Any], Any]
    base: Any = None


def params_layout(spec: RunSpec, model: Any, partitioner: Any) -> ParamsLayout:
    """The `ParamsLayout` of the spec's checkpoints for `model` (the spec's network; with
    `model.lora.rank`, `builder.trainable_model`'s adapters over it, whose base, the config's
    `init.*` source, is read here, once)."""
    trainer = builder.make_trainer(spec, builder.trainable_model(spec, model), partitioner)
    # One row per data-parallel shard: the params' layout does not depend on the batch.
    rows = partitioner.batch_parts() // partitioner.data_layout().num_shards
    batch = zero_batch(spec, rows)
    state = trainer.setup(batch)
    if spec.lora is None:
        return ParamsLayout(state.params, lambda params: params)
    base = builder.base_params(spec, trainer, batch)
    return ParamsLayout(
        state.params, lambda adapters: trainer.eval_params(state.replace(params=adapters, frozen=base)), base
    )


def load_params(layout: ParamsLayout, path: str, step: int | None = None) -> tuple[int, Any]:
    """`(step, params)` of the checkpoint at `path` (a model_dir, its checkpoints folder, or one
    step's folder), restored as `layout` (`params_layout`) lays them out, as the model's params
    (`ParamsLayout.to_model`); the latest complete step unless `step` is given. On several
    processes, process 0 chooses the step (a checkpoint may complete while they look) and all
    restore it."""
    from cairn.trainer import restore_params

    if storage.path(storage.join(path, "state")).is_dir():
        chosen = int(storage.path(path).name) if step is None else step
        target = path
    else:

        def choose() -> list[int]:
            steps = complete_steps(path)
            if not steps:
                raise ConfigError("checkpoint", f"no complete checkpoint under {path!r}")
            if step is not None and step not in steps:
                raise ConfigError("step", f"no complete checkpoint at step {step} in {path!r}; have {steps}")
            return [steps[-1] if step is None else step]

        chosen = run_setup.from_process_0(choose)[0]
        target = storage.join(checkpoint_root(path), str(chosen))
    return chosen, layout.to_model(restore_params(target, layout.abstract))
