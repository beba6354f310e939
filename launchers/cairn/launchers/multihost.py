"""Joining a multi-process JAX job before anything touches a device.

Where the values come from, first found wins: the config (`multihost.coordinator_address`,
`coordinator_bind_address`, `num_processes`, `process_id`), then `$CAIRN_COORDINATOR_ADDRESS`,
`$CAIRN_COORDINATOR_BIND_ADDRESS`, `$CAIRN_NUM_PROCESSES`, `$CAIRN_PROCESS_ID`, then what
`cairn.partitioning.initialize_distributed` reads itself: `$JAX_COORDINATOR_ADDRESS`...,
SLURM (`SLURM_NTASKS` > 1, `SLURM_PROCID`) and TPU pods (plain `jax.distributed.initialize()`).
One process: nothing happens.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

import ml_collections

from cairn.launchers.validation import ConfigError

ENV = {"coordinator_address": "CAIRN_COORDINATOR_ADDRESS",
       "coordinator_bind_address": "CAIRN_COORDINATOR_BIND_ADDRESS",
       "num_processes": "CAIRN_NUM_PROCESSES", "process_id": "CAIRN_PROCESS_ID"}


def multihost_args(config: ml_collections.ConfigDict, env: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """The keyword arguments for `initialize_distributed` (None where unset)."""
    env = os.environ if env is None else env
    out: dict[str, Any] = {}
    for key, var in ENV.items():
        value = config.multihost[key]
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


def initialize(config: ml_collections.ConfigDict) -> Any:
    """Joins the job the config and the environment describe; returns the decision
    (`cairn.partitioning.DistributedConfig`). Call before any other JAX use."""
    from cairn.partitioning import initialize_distributed

    args = multihost_args(config)
    try:
        return initialize_distributed(**args)
    except ValueError as e:
        raise ConfigError("multihost", str(e)) from None
