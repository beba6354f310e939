"""Multi-host start-up: `jax.distributed.initialize` from flags, the environment or the cluster."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax

#: Environment variables read when no flag gives the value.
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
ENV_BIND_ADDRESS = "JAX_COORDINATOR_BIND_ADDRESS"


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """How this process joins the job.

    `mode` is 'single' (one process: nothing to do), 'explicit' (coordinator, process count
    and index given by flags or environment), or 'auto' (SLURM or a TPU pod: JAX reads the
    cluster itself).
    """

    mode: str
    coordinator_address: str | None = None
    num_processes: int = 1
    process_id: int = 0
    coordinator_bind_address: str | None = None


def _int(value, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def resolve_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    coordinator_bind_address: str | None = None,
    env: Mapping[str, str] | None = None,
) -> DistributedConfig:
    """Decides how to initialize, without doing it. Flags win over the environment
    (`JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`,
    `JAX_COORDINATOR_BIND_ADDRESS`); then SLURM (`SLURM_NTASKS` > 1) and TPU pods
    (`TPU_WORKER_HOSTNAMES` with several hosts, or `MEGASCALE_COORDINATOR_ADDRESS`)."""
    env = os.environ if env is None else env
    address = coordinator_address or env.get(ENV_COORDINATOR) or None
    count = num_processes if num_processes is not None else _int(env.get(ENV_NUM_PROCESSES), ENV_NUM_PROCESSES)
    index = process_id if process_id is not None else _int(env.get(ENV_PROCESS_ID), ENV_PROCESS_ID)
    bind = coordinator_bind_address or env.get(ENV_BIND_ADDRESS) or None
    if address or count is not None or index is not None:
        if count == 1:
            return DistributedConfig("single")
        missing = [
            name
            for name, value in (("coordinator_address", address), ("num_processes", count), ("process_id", index))
            if value is None
        ]
        if missing or address is None or count is None or index is None:
            raise ValueError(
                f"multi-host start-up needs coordinator_address, num_processes and "
                f"process_id; missing {missing} (flags or {ENV_COORDINATOR}, "
                f"{ENV_NUM_PROCESSES}, {ENV_PROCESS_ID})"
            )
        if count < 1 or not 0 <= index < count:
            raise ValueError(f"process_id {index} is not in [0, num_processes={count})")
        return DistributedConfig("explicit", address, count, index, bind)
    slurm_tasks = _int(env.get("SLURM_NTASKS"), "SLURM_NTASKS")
    if env.get("SLURM_JOB_ID") and slurm_tasks and slurm_tasks > 1:
        return DistributedConfig(
            "auto", num_processes=slurm_tasks, process_id=_int(env.get("SLURM_PROCID"), "SLURM_PROCID") or 0
        )
    tpu_hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    if len(tpu_hosts) > 1 or env.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return DistributedConfig(
            "auto",
            num_processes=max(len(tpu_hosts), 1),
            process_id=_int(env.get("TPU_WORKER_ID"), "TPU_WORKER_ID") or 0,
        )
    return DistributedConfig("single")


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    coordinator_bind_address: str | None = None,
    local_device_ids: Sequence[int] | None = None,
    initialization_timeout: int = 300,
    heartbeat_timeout_seconds: float | None = None,
) -> DistributedConfig:
    """Joins a multi-process JAX job; a no-op on one process or when already initialized.

    Call before anything touches a device. See `resolve_distributed` for where the
    coordinator comes from. Returns what was decided.

    `heartbeat_timeout_seconds`: when given, a peer process that stops responding for that long
    (killed, host lost) stops this one with one line naming it and exit status 3
    (`cairn.partitioning.peer_watchdog`), instead of JAX's later SIGABRT; JAX's own heartbeat
    timeout is set beyond it. None: JAX's default behaviour (100 s, then SIGABRT).
    """
    from cairn.partitioning import peer_watchdog

    if heartbeat_timeout_seconds is not None and not heartbeat_timeout_seconds > 0:
        raise ValueError(f"heartbeat_timeout_seconds must be > 0, got {heartbeat_timeout_seconds}")
    config = resolve_distributed(coordinator_address, num_processes, process_id, coordinator_bind_address)
    if config.mode == "single" or jax.distributed.is_initialized():
        return config
    extra: dict[str, Any] = {}
    if heartbeat_timeout_seconds is not None:
        extra["heartbeat_timeout_seconds"] = peer_watchdog.jax_heartbeat_timeout(heartbeat_timeout_seconds)
    if config.mode == "auto":
        jax.distributed.initialize(
            local_device_ids=local_device_ids, initialization_timeout=initialization_timeout, **extra
        )
    else:
        jax.distributed.initialize(
            coordinator_address=config.coordinator_address,
            num_processes=config.num_processes,
            process_id=config.process_id,
            local_device_ids=local_device_ids,
            coordinator_bind_address=config.coordinator_bind_address,
            initialization_timeout=initialization_timeout,
            **extra,
        )
    if heartbeat_timeout_seconds is not None:
        peer_watchdog.start_peer_watchdog(heartbeat_timeout_seconds)
    return config
