"""Joining a multi-process JAX job before anything touches a device.

Where the values come from, first found wins: the config (`multihost.coordinator_address`,
`coordinator_bind_address`, `num_processes`, `process_id`), then `$CAIRN_COORDINATOR_ADDRESS`,
`$CAIRN_COORDINATOR_BIND_ADDRESS`, `$CAIRN_NUM_PROCESSES`, `$CAIRN_PROCESS_ID`, then what
`cairn.partitioning.initialize_distributed` reads itself: `$JAX_COORDINATOR_ADDRESS`...,
SLURM (`SLURM_NTASKS` > 1, `SLURM_PROCID`) and TPU pods (plain `jax.distributed.initialize()`).
One process: nothing happens.

Start-up is bounded: a process that has not joined within `multihost.initialization_timeout_seconds`
(a coordinator that never answers, a process that never started) exits with status 2 and one
line naming the coordinator address, its process id and the process count (JAX itself would
wait and then abort with a C++ stack trace). Once joined, a process that stops responding
for `multihost.heartbeat_timeout_seconds` (killed, host lost) stops the others with one line
naming it (`cairn.partitioning.peer_watchdog`; 0: JAX's own behaviour). After joining, `check_same_config` stops every
process with one line when they were started with different configs. Once joined, process 0
speaks: the others log warnings and errors only, prefixed with their index, and Gloo's connection
lines are dropped unless `--verbose` (`process_output`).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from absl import flags

from cairn.launchers import process_output
from cairn.launchers.validation import ConfigError

ENV = {
    "coordinator_address": "CAIRN_COORDINATOR_ADDRESS",
    "coordinator_bind_address": "CAIRN_COORDINATOR_BIND_ADDRESS",
    "num_processes": "CAIRN_NUM_PROCESSES",
    "process_id": "CAIRN_PROCESS_ID",
}


def multihost_args(config: Any, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The keyword arguments for `initialize_distributed` (None where unset)."""
    env = os.environ if env is None else env
    out: dict[str, Any] = {}
    for key, var in ENV.items():
        value = getattr(config.multihost, key)
        if value in (None, ""):
            value = env.get(var) or None
        if value is not None and key in ("num_processes", "process_id"):
            try:
                value = int(value)
            except ValueError:
                raise ConfigError(f"multihost.{key}", f"must be an integer, got {value!r} (from ${var})") from None
        out[key] = value
    if out["coordinator_address"] and not out["coordinator_bind_address"]:
        # A coordinator on this machine listens where it is told to; elsewhere on every interface.
        host, _, port = out["coordinator_address"].rpartition(":")
        if host in ("127.0.0.1", "localhost") and port:
            out["coordinator_bind_address"] = f"127.0.0.1:{port}"
    return out


class _StartupWatchdog:
    """Exits the process with status 2 and `message` unless `cancel` comes within `seconds`
    (a thread: JAX's own timeout aborts with a C++ stack trace instead)."""

    def __init__(self, seconds: float, message: str):
        self._start = time.monotonic()
        self._message = message
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        waited = time.monotonic() - self._start
        sys.stderr.write(f"error: {self._message} (waited {waited:.0f} s; multihost.initialization_timeout_seconds)\n")
        sys.stderr.flush()
        os._exit(2)

    def __enter__(self) -> _StartupWatchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()


def initialize(config: Any) -> Any:
    """Joins the job the config and the environment describe; returns the decision
    (`cairn.partitioning.DistributedConfig`). Call before any other JAX use. Exits with
    status 2 when the job is not joined within `multihost.initialization_timeout_seconds`."""
    from cairn.partitioning import initialize_distributed, resolve_distributed

    args = multihost_args(config)
    bound = float(config.multihost.initialization_timeout_seconds)
    try:
        decided = resolve_distributed(**args)
        if decided.mode == "single":
            return decided
        where = (
            f"coordinator {decided.coordinator_address}" if decided.coordinator_address else "the cluster's coordinator"
        )
        message = (
            f"process {decided.process_id} of {decided.num_processes} could not join the job at {where}: "
            f"it never answered, or not all {decided.num_processes} processes started"
        )
        with _StartupWatchdog(bound, message):
            # JAX's own bound is later than ours, so ours always fires first.
            joined = initialize_distributed(
                **args,
                initialization_timeout=int(bound) + 60,
                heartbeat_timeout_seconds=config.multihost.heartbeat_timeout_seconds or None,
            )
        import jax

        process_output.speak_from_process_0(jax.process_index(), jax.process_count(), _verbose())
        return joined
    except ValueError as e:
        raise ConfigError("multihost", str(e)) from None


def _verbose() -> bool:
    """The entry points' `--verbose` (False when flags are not parsed: a caller in a test)."""
    return bool(flags.FLAGS.is_parsed() and "verbose" in flags.FLAGS and flags.FLAGS.verbose)


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two plain configs."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _differences(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [prefix[:-1]]


def check_same_config(plain: Mapping[str, Any]) -> None:
    """With several processes: every process must have been started with the same config
    (all but the `multihost` section). Otherwise every process raises a `ConfigError` naming
    the processes and the keys that differ. A collective (call it on every process)."""
    import jax

    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    plain = {k: v for k, v in plain.items() if k != "multihost"}
    mine = np.frombuffer(json.dumps(plain, sort_keys=True).encode(), np.uint8)
    lengths = np.asarray(multihost_utils.process_allgather(np.array([mine.size], np.int32))).reshape(-1)
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[: mine.size] = mine
    texts = np.asarray(multihost_utils.process_allgather(padded))
    configs = [json.loads(bytes(texts[p, : lengths[p]]).decode()) for p in range(len(lengths))]
    differing = [(p, _differences(configs[0], c)) for p, c in enumerate(configs) if p and c != configs[0]]
    if differing:
        shown = "; ".join(
            f"process {p} differs from process 0 in {', '.join(keys[:8])}"
            + (f" (+{len(keys) - 8} more)" if len(keys) > 8 else "")
            for p, keys in differing
        )
        raise ConfigError("multihost", f"the processes were started with different configs: {shown}")


def stop_together(error: BaseException | None, what: str) -> None:
    """With several processes: every process calls this at the same point with the error it
    met (or None). The process that failed re-raises its own error; the others raise a
    `ConfigError` naming the processes that failed, so no process is left waiting in a
    collective. A collective (call it on every process)."""
    import jax

    if jax.process_count() == 1:
        if error is not None:
            raise error
        return
    from jax.experimental import multihost_utils

    flags = np.asarray(multihost_utils.process_allgather(np.array([error is not None], np.int32))).reshape(-1)
    if error is not None:
        raise error
    failed = [int(p) for p in np.nonzero(flags)[0]]
    if failed:
        raise ConfigError(
            "multihost",
            f"process(es) {failed} of {len(flags)} failed while {what} "
            f"(see their error); stopping process {jax.process_index()} too",
        )
