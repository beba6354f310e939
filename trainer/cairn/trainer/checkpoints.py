"""Checkpoints with orbax: train state, data-iterator state and config; async saves, keep the
last K (and optionally the best by a metric), verified restores that skip corrupt checkpoints.

Asynchronous saves run orbax's whole save (device-to-host copy, write, commit, deletion of old
steps) in one background thread, so the loop blocks only while a previous save is still running.
With several processes that thread must not run device collectives: the loop runs its own
(per-step all-gathers) at the same time, and collectives issued from two threads pair up in
different orders on different processes (seen as "sync_global_devices name mismatch", or as an
all-gather returning another collective's data). orbax's barriers are collectives by default;
`Checkpointer` switches them to the JAX distributed client's barriers (named, thread-safe, with a
timeout: orbax's `experimental_orbax_use_distributed_barrier`). Where that switch is missing
(another orbax), asynchronous saves fall back to orbax's own async checkpointing started from the
caller's thread (collectives in the caller's thread; about 50 ms of blocking per save).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from cairn import storage

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
MANIFEST_DIR = "manifests"
CORRUPT_DIR = "corrupt_checkpoints"


class NoCheckpointError(FileNotFoundError):
    """No usable checkpoint in model_dir."""


class CorruptCheckpointError(RuntimeError):
    """A checkpoint's files do not match its manifest, or orbax cannot read it."""


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Checkpointing options.

    keep: how many of the latest checkpoints to keep (None: all).
    best_metric / best_mode: also keep the checkpoint with the best value of this metric
      (given to `save(metrics=...)`), 'min' or 'max'.
    asynchronous: save in a background thread; `save` blocks only while the previous save is
      still running. Works with any number of processes (call `save` on every process). The
      arrays saved must not be donated or deleted until the save is done.
    save_dtype: cast floating params to this dtype when saving (e.g. 'bfloat16'); None keeps them.
    """

    keep: int | None = 3
    best_metric: str | None = None
    best_mode: str = "min"
    asynchronous: bool = True
    save_dtype: str | None = None

    def __post_init__(self):
        if self.keep is not None and self.keep < 1:
            raise ValueError(f"CheckpointConfig.keep must be >= 1 or None, got {self.keep}")
        if self.best_mode not in ("min", "max"):
            raise ValueError(f"CheckpointConfig.best_mode must be 'min' or 'max', got {self.best_mode!r}")


def _state_dict(state: Any) -> dict:
    return {"params": state.params, "opt_state": state.opt_state, "step": state.step, "rng": state.rng}


def _cast(tree: Any, dtype: str | None) -> Any:
    if dtype is None:
        return tree
    return jax.tree.map(lambda x: x.astype(dtype) if jax.numpy.issubdtype(x.dtype, jax.numpy.floating) else x, tree)


def use_client_barriers() -> bool:
    """Makes orbax's cross-process barriers go through the JAX distributed client instead of
    device collectives (so a save may run in a background thread while the loop runs its
    collectives): orbax's absl flag `experimental_orbax_use_distributed_barrier`, set even before
    absl parses a command line (tests, notebooks). Returns False when this orbax has no such flag."""
    from orbax.checkpoint._src.multihost import multihost as orbax_multihost  # where orbax reads it

    holder = getattr(orbax_multihost, "EXPERIMENTAL_ORBAX_USE_DISTRIBUTED_BARRIER", None)
    if holder is None:
        return False
    flag = orbax_multihost.flags.FLAGS[holder.name]
    flag.value = True
    flag.present = 1  # readable before parsing
    return True


class Checkpointer:
    """Saves and restores checkpoints under `<model_dir>/checkpoints/<step>/` (orbax items
    `state`, `data`, `config`), with a size manifest per finished checkpoint in
    `<model_dir>/manifests/<step>.json`. Only process 0 writes manifests and moves corrupt
    checkpoints aside (to `<model_dir>/corrupt_checkpoints/`). `model_dir` may be a URL
    (`gs://...`): orbax writes the arrays through tensorstore and commits each checkpoint by a
    marker written last; manifests are single whole-object uploads."""

    def __init__(self, model_dir: str | os.PathLike, config: CheckpointConfig = CheckpointConfig()):
        self.model_dir = storage.path(model_dir)
        self.config = config
        self.directory = self.model_dir / CHECKPOINT_DIR
        # Whole saves in our thread; orbax's async mode (started from the caller) only as a fallback.
        self._background = config.asynchronous and (jax.process_count() == 1 or use_client_barriers())
        self._orbax_async = config.asynchronous and not self._background
        self._pending: list[int] = []  # saved steps whose manifests are not written yet
        self._manager = self._make_manager()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cairn-checkpoint")
        self._future: Future | None = None

    def _make_manager(self) -> ocp.CheckpointManager:
        pp = ocp.checkpoint_managers.preservation_policy
        policies = [pp.LatestN(self.config.keep) if self.config.keep else pp.PreserveAll()]
        if self.config.best_metric:
            name = self.config.best_metric
            policies.append(
                pp.BestN(
                    get_metric_fn=lambda m: float(m[name]),
                    reverse=self.config.best_mode == "min",
                    n=1,
                    keep_checkpoints_without_metrics=False,
                )
            )
        options = ocp.CheckpointManagerOptions(
            preservation_policy=pp.AnyPreservationPolicy(policies),
            create=True,
            cleanup_tmp_directories=True,
            enable_async_checkpointing=self._orbax_async,
        )
        return ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data", "config"))

    # -- saving ----------------------------------------------------------------------------
    def save(
        self,
        step: int,
        state: Any,
        data_state: Mapping[str, Any] | None = None,
        config: Mapping[str, Any] | None = None,
        metrics: Mapping[str, float] | None = None,
    ) -> float:
        """Starts saving `state` (a TrainState) at `step`, on every process; returns the seconds the
        caller was blocked (waiting for the previous save, if it is still running)."""
        start = time.perf_counter()
        self._wait_future()
        state_tree = _state_dict(state)
        state_tree["params"] = _cast(state_tree["params"], self.config.save_dtype)  # a computation: this thread
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state_tree),
            data=ocp.args.JsonSave(dict(data_state or {})),
            config=ocp.args.JsonSave(dict(config or {})),
        )
        metrics = {k: float(v) for k, v in (metrics or {}).items()} or None
        if self._background:
            self._future = self._executor.submit(self._save, int(step), args, metrics)
        else:
            self._save(int(step), args, metrics)
        return time.perf_counter() - start

    def _wait_future(self) -> None:
        if self._future is not None:
            future, self._future = self._future, None
            future.result()  # re-raises a failed background save

    def _save(self, step: int, args: Any, metrics: dict | None) -> None:
        self._finish_pending()
        self._manager.save(step, args=args, metrics=metrics, force=True)
        self._pending.append(step)
        if not self._orbax_async:
            self._finish_pending()

    def wait(self) -> None:
        """Blocks until every started save is on disk (and has its manifest)."""
        self._wait_future()
        self._manager.wait_until_finished()
        self._finish_pending()

    def _finish_pending(self) -> None:
        """Waits for orbax's write in flight; process 0 writes the manifests of the steps it kept
        and drops those of deleted steps."""
        if not self._pending:
            return
        self._manager.wait_until_finished()
        if jax.process_index() == 0:
            kept = set(self._manager.all_steps())
            for step in self._pending:
                if step in kept:
                    storage.write_json(self._manifest(step), storage.file_sizes(self.directory / str(step)))
            for name in storage.sizes(self.model_dir / MANIFEST_DIR):
                stem = name[: -len(".json")] if name.endswith(".json") else ""
                if stem.isdigit() and int(stem) not in kept:
                    storage.remove(self.model_dir / MANIFEST_DIR / name)
        self._pending.clear()

    def _manifest(self, step: int) -> storage.Path:
        return self.model_dir / MANIFEST_DIR / f"{step}.json"

    # -- restoring -------------------------------------------------------------------------
    def all_steps(self) -> list:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def verify(self, step: int) -> None:
        """Raises `CorruptCheckpointError` when the checkpoint's files differ from its manifest
        (missing, truncated or grown); a checkpoint without a manifest passes."""
        try:
            expected = storage.read_json(self._manifest(step))
        except FileNotFoundError:
            return
        actual = storage.file_sizes(self.directory / str(step))
        bad = sorted(name for name in expected if actual.get(name) != expected[name])
        if bad:
            detail = ", ".join(f"{n} ({actual.get(n, 'missing')} bytes, expected {expected[n]})" for n in bad[:3])
            raise CorruptCheckpointError(f"checkpoint {self.directory / str(step)} is corrupt: {detail}")

    def _quarantine(self, step: int, error: Exception) -> None:
        log.error(
            "checkpoint at step %d is unusable (%s); moving it to %s and using the previous one",
            step,
            error,
            self.model_dir / CORRUPT_DIR,
        )
        if jax.process_index() == 0:
            target = self.model_dir / CORRUPT_DIR / str(step)
            storage.remove_tree(target)
            storage.move_tree(self.directory / str(step), target)
            storage.remove(self._manifest(step))
        self._manager.close()
        self._manager = self._make_manager()

    def restore(self, abstract_state: Any, step: int | None = None) -> tuple[int, Any, dict, dict]:
        """`(step, state, data_state, config)` from the latest usable checkpoint (or `step`).

        `abstract_state` is a TrainState of `jax.ShapeDtypeStruct`s with the target shardings, so
        a checkpoint restores onto any mesh. A corrupt latest checkpoint is reported, moved aside
        and the previous one used. Raises `NoCheckpointError` when none is usable."""
        target = _state_dict(abstract_state)
        candidates = [step] if step is not None else list(reversed(self.all_steps()))
        for s in candidates:
            try:
                self.verify(s)
                out = self._manager.restore(
                    s,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(target),
                        data=ocp.args.JsonRestore(),
                        config=ocp.args.JsonRestore(),
                    ),
                )
            except Exception as e:
                if step is not None:
                    raise CorruptCheckpointError(f"cannot restore step {s} from {self.directory}: {e}") from e
                self._quarantine(s, e)
                continue
            tree = out["state"]
            state = type(abstract_state)(
                params=tree["params"], opt_state=tree["opt_state"], step=tree["step"], rng=tree["rng"]
            )
            return s, state, dict(out["data"] or {}), dict(out["config"] or {})
        raise NoCheckpointError(f"no usable checkpoint in {self.directory}")

    def close(self) -> None:
        """Waits for pending saves and releases orbax's threads."""
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)
            self._manager.close()


def restore_params(path: str | os.PathLike, abstract_params: Any, step: int | None = None) -> Any:
    """Only the params of a checkpoint (a model_dir, its `checkpoints` folder, or one step's
    folder), cast and sharded as `abstract_params` (ShapeDtypeStructs with shardings) says.
    For fine-tuning from a pretrained run."""
    root = storage.path(path)
    if (root / CHECKPOINT_DIR).is_dir():
        root = root / CHECKPOINT_DIR
    if not (root / "state").is_dir():
        steps = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.is_dir() else []
        if step is None and not steps:
            raise NoCheckpointError(f"no checkpoint in {root}")
        root = root / str(step if step is not None else steps[-1])
    item = {"params": abstract_params}
    restore_args = ocp.checkpoint_utils.construct_restore_args(item)
    with ocp.PyTreeCheckpointer() as ckptr:
        out = ckptr.restore(
            root / "state", args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True)
        )
    return out["params"]


def abstract_like(tree: Any, shardings: Any) -> Any:
    """`jax.ShapeDtypeStruct`s of `tree` carrying `shardings`."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s), tree, shardings)
