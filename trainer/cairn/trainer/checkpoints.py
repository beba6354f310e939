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
from cairn.storage import retries
from cairn.trainer import manifests
from cairn.trainer.faults import free_space, write_failure, write_failure_code
from cairn.trainer.manifests import MANIFEST_DIR, last_good_step
from cairn.trainer.replica_writes import configure_array_writes
from cairn.trainer.save_failures import drain_failed_saves
from cairn.trainer.storage_retries import apply_retry_budget

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
CORRUPT_DIR = "corrupt_checkpoints"
# model_dir -> the last checkpoint this process restored or finished (its manifest written):
# what an error during a storage outage names, without reading the bucket
_COMMITTED: dict[str, int] = {}


def last_committed(model_dir: str | os.PathLike) -> int | None:
    """The last checkpoint of `model_dir` this process restored or finished saving (None: none)."""
    return _COMMITTED.get(os.fspath(model_dir).rstrip("/"))


def _committed(model_dir: Any, step: int) -> None:
    key = os.fspath(model_dir).rstrip("/")
    _COMMITTED[key] = max(step, _COMMITTED.get(key, step))


class NoCheckpointError(FileNotFoundError):
    """No usable checkpoint in model_dir."""


class CorruptCheckpointError(RuntimeError):
    """A checkpoint's files do not match its manifest, or orbax cannot read it."""


class AllCheckpointsCorruptError(CorruptCheckpointError):
    """model_dir has checkpoints but none is usable: a run must not silently start from step 0."""

    def __init__(self, directory: Any, failed: list[tuple[int, str]], moved: bool = False):
        self.steps = [s for s, _ in failed]
        where = f"moved to {storage.join(os.path.dirname(os.fspath(directory)), CORRUPT_DIR)} by an earlier run"
        detail = "; ".join(f"step {s}: {why}" for s, why in failed)
        super().__init__(
            f"every checkpoint in {directory} is unusable ({detail})"
            f"{'; they were ' + where if moved else '; nothing was moved or deleted'}. Put a good copy "
            f"back, or set restart_if_corrupt (the train program: --restart_if_corrupt) to move them "
            f"aside and start again from step 0"
        )


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
    restart_if_corrupt: when every checkpoint is unusable, move them all to
      `corrupt_checkpoints/` and start from step 0 (default: refuse with
      `AllCheckpointsCorruptError`, never a silent restart).
    """

    keep: int | None = 3
    best_metric: str | None = None
    best_mode: str = "min"
    asynchronous: bool = True
    save_dtype: str | None = None
    restart_if_corrupt: bool = False

    def __post_init__(self):
        if self.keep is not None and self.keep < 1:
            raise ValueError(f"CheckpointConfig.keep must be >= 1 or None, got {self.keep}")
        if self.best_mode not in ("min", "max"):
            raise ValueError(f"CheckpointConfig.best_mode must be 'min' or 'max', got {self.best_mode!r}")


def _state_dict(state: Any) -> dict:
    """What a checkpoint holds of a TrainState (its `model_state` only when it has one)."""
    tree = {"params": state.params, "opt_state": state.opt_state, "step": state.step, "rng": state.rng}
    if getattr(state, "model_state", None) is not None:
        tree["model_state"] = state.model_state
    return tree


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
    `state`, `data`, `config`), with a manifest (size and SHA-256 of every file) per finished checkpoint in
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
        configure_array_writes()  # one process: arrays written whole (no per-shape slicing)
        drain_failed_saves()  # a failed save lets its other writes finish (no closed-loop tracebacks)
        apply_retry_budget()  # tensorstore retries a stuttering bucket as long as gcsfs does
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
        try:
            self._finish_pending()
            self._manager.save(step, args=args, metrics=metrics, force=True)
            self._pending.append(step)
            if not self._orbax_async:
                self._finish_pending()
        except Exception as e:
            self._raise_write_failure(e, step)
            self._raise_outage(e, step)
            raise

    def _raise_outage(self, error: Exception, step: int | None) -> None:
        """A bucket that stayed unavailable past the retry budget (gcsfs's, or tensorstore's
        error when its retries ran out) becomes one `StorageUnavailableError` naming the bucket
        and the checkpoint being written; any other error is left to the caller."""
        what = f"writing checkpoint step {step}" if step is not None else "finishing a checkpoint"
        outage = retries.as_outage(error, retries.bucket_of(os.fspath(self.model_dir)), what)
        if outage is not None:
            self._pending.clear()
            raise outage from error

    def _raise_write_failure(self, error: Exception, step: int | None) -> None:
        """A write the storage refused (a full disk, a quota, the file size limit, a read-only
        path: `faults.write_failure_code`) becomes one `StorageWriteError` (`DiskFullError` for
        space), the partial step removed and the last checkpoint with a manifest named as intact;
        any other error is left to the caller."""
        code = write_failure_code(error)
        if code is None:
            return
        self._pending.clear()
        free = free_space(self.model_dir)  # at the failure: before the partial step gives its space back
        if jax.process_index() == 0 and step is not None and not storage.is_url(self.directory):
            for name in os.listdir(self.directory) if self.directory.is_dir() else ():
                if name.startswith(f"{step}.") and "tmp" in name:  # orbax's uncommitted step
                    storage.remove_tree(self.directory / name)
        raise write_failure(
            str(self.model_dir), f"checkpoint step {step}", last_good_step(self.model_dir, step), code, free
        ) from error

    def raise_if_failed(self) -> None:
        """Re-raises at once the error of a background save that has already failed (a write the
        storage refused is a `StorageWriteError`); nothing while it runs or after it succeeded."""
        if self._future is not None and self._future.done() and self._future.exception() is not None:
            self._wait_future()

    def wait(self) -> None:
        """Blocks until every started save is on disk (and has its manifest)."""
        self._wait_future()
        try:
            self._manager.wait_until_finished()
            self._finish_pending()
        except Exception as e:
            step = self._pending[-1] if self._pending else None
            self._raise_write_failure(e, step)
            self._raise_outage(e, step)
            raise

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
                    storage.write_json(self._manifest(step), manifests.manifest(self.directory / str(step)))
                    _committed(self.model_dir, step)
            for name in storage.sizes(self.model_dir / MANIFEST_DIR):
                stem = name[: -len(".json")] if name.endswith(".json") else ""
                if stem.isdigit() and int(stem) not in kept:
                    storage.remove(self.model_dir / MANIFEST_DIR / name)
        else:
            for step in self._pending:
                _committed(self.model_dir, step)
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
        """Raises `CorruptCheckpointError` naming the files that differ from the checkpoint's
        manifest (missing, truncated, grown, or the same size with other bytes: SHA-256); a
        checkpoint without a manifest passes."""
        try:
            expected = storage.read_json(self._manifest(step))
        except FileNotFoundError:
            return
        bad = manifests.mismatches(self.directory / str(step), expected)
        if bad:
            more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            raise CorruptCheckpointError(
                f"checkpoint {self.directory / str(step)} is corrupt: {', '.join(bad[:3])}{more}"
            )

    def _quarantine(self, steps: list[int]) -> None:
        """Moves `steps` to `<model_dir>/corrupt_checkpoints/` (process 0) and reopens orbax."""
        if jax.process_index() == 0:
            for step in steps:
                target = self.model_dir / CORRUPT_DIR / str(step)
                storage.remove_tree(target)
                storage.move_tree(self.directory / str(step), target)
                storage.remove(self._manifest(step))
        self._manager.close()
        self._manager = self._make_manager()

    def quarantined_steps(self) -> list[int]:
        """Steps moved to `corrupt_checkpoints/` by an earlier restore."""
        root = self.model_dir / CORRUPT_DIR
        if not root.is_dir():
            return []
        return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit())

    def _restore_step(self, step: int, abstract_state: Any) -> tuple[int, Any, dict, dict]:
        self.verify(step)
        out = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(_state_dict(abstract_state)),
                data=ocp.args.JsonRestore(),
                config=ocp.args.JsonRestore(),
            ),
        )
        tree = out["state"]
        carried = {"model_state": tree["model_state"]} if "model_state" in tree else {}
        state = type(abstract_state)(
            params=tree["params"], opt_state=tree["opt_state"], step=tree["step"], rng=tree["rng"], **carried
        )
        return step, state, dict(out["data"] or {}), dict(out["config"] or {})

    def restore(self, abstract_state: Any, step: int | None = None) -> tuple[int, Any, dict, dict]:
        """`(step, state, data_state, config)` from the latest usable checkpoint (or `step`).

        `abstract_state` is a TrainState of `jax.ShapeDtypeStruct`s with the target shardings, so
        a checkpoint restores onto any mesh. Corrupt later checkpoints are reported (a warning
        naming the files), moved to `corrupt_checkpoints/` and the previous one used. Raises
        `AllCheckpointsCorruptError` (moving nothing) when checkpoints exist but none is usable,
        `NoCheckpointError` when there is none."""
        if step is not None:
            try:
                return self._restore_step(step, abstract_state)
            except Exception as e:
                raise CorruptCheckpointError(f"cannot restore step {step} from {self.directory}: {e}") from e
        failed: list[tuple[int, str]] = []
        for s in reversed(self.all_steps()):
            try:
                found = self._restore_step(s, abstract_state)
            except Exception as e:
                outage = retries.as_outage(e, retries.bucket_of(os.fspath(self.model_dir)), f"restoring step {s}")
                if outage is not None:  # the bucket is down, not the checkpoint corrupt: nothing moved
                    raise outage from e
                why = (str(e).splitlines() or [type(e).__name__])[0][:300]
                failed.append((s, why))
                continue
            for f, why in failed:  # said once a usable step is found (else the error names them)
                log.warning("checkpoint at step %d is unusable: %s", f, why)
            if failed:
                log.warning(
                    "using step %d; moving the unusable steps %s to %s",
                    s,
                    ", ".join(str(f) for f, _ in failed),
                    self.model_dir / CORRUPT_DIR,
                )
                self._quarantine([f for f, _ in failed])
            _committed(self.model_dir, s)
            return found
        if failed:
            raise AllCheckpointsCorruptError(self.directory, failed)
        moved = self.quarantined_steps()
        if moved:
            raise AllCheckpointsCorruptError(self.directory, [(m, "found corrupt") for m in moved], moved=True)
        raise NoCheckpointError(f"no usable checkpoint in {self.directory}")

    def restore_or_none(self, abstract_state: Any) -> tuple[int, Any, dict, dict] | None:
        """`restore` for resuming: None when model_dir has never had a checkpoint; when every
        checkpoint is unusable, `AllCheckpointsCorruptError` unless `restart_if_corrupt`
        (then they are moved aside with a warning, and None)."""
        try:
            return self.restore(abstract_state)
        except NoCheckpointError:
            return None
        except AllCheckpointsCorruptError as e:
            if not self.config.restart_if_corrupt:
                raise
            log.warning("%s; restart_if_corrupt is set: starting again from step 0", e)
            self._quarantine([s for s in e.steps if s in self.all_steps()])
            return None

    def close(self) -> None:
        """Waits for pending saves and releases orbax's threads."""
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)
            self._manager.close()


def abstract_like(tree: Any, shardings: Any) -> Any:
    """`jax.ShapeDtypeStruct`s of `tree` carrying `shardings`."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s), tree, shardings)


# -- reading only the params of a checkpoint (fine-tuning, upcycling): `restore_params` loads
# them cast and sharded as asked, `stored_params` gives their shapes and dtypes from the metadata


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


def restore_opt_state(path: str | os.PathLike, abstract_opt_state: Any, step: int | None = None) -> Any:
    """Only the optimizer state of a checkpoint (located as by `restore_params`), sharded as
    `abstract_opt_state` (the `Trainer`'s `abstract_state.opt_state`) says: a run's moments and
    counts, for a program that continues its training (`cairn.launchers.interactive`). Raises
    when the checkpoint's optimizer state has another structure (another optimizer)."""
    root = _step_dir(path, step)
    item = {"opt_state": abstract_opt_state}
    restore_args = ocp.checkpoint_utils.construct_restore_args(item)
    with ocp.PyTreeCheckpointer() as ckptr:
        out = ckptr.restore(
            root / "state", args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True)
        )
    return out["opt_state"]


def stored_params(path: str | os.PathLike, step: int | None = None) -> Any:
    """The params a checkpoint holds (located as by `restore_params`) as `jax.ShapeDtypeStruct`s,
    read from its metadata (nothing loaded)."""
    with ocp.PyTreeCheckpointer() as ckptr:
        tree = ckptr.metadata(_step_dir(path, step) / "state").item_metadata.tree
    return jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), tree["params"], is_leaf=lambda m: hasattr(m, "shape")
    )
