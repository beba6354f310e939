"""The platform programs are built for, and platform-gated choices.

A model's platform-dependent choices (the TPU attention kernels, the decode cache's TPU layout,
the CPU-tuned backward passes) follow `backend()`: this process's default backend, or, inside
`compile_target(platform)`, the platform of an ahead-of-time compile for devices this host does
not have (`cairn.partitioning.topology`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import jax

PLATFORMS = ("cpu", "gpu", "tpu")

_targets: list[str] = []  # the open `compile_target`s, innermost last (process-wide)
_lock = threading.Lock()


def backend() -> str:
    """ "cpu", "gpu" or "tpu": the platform of the programs traced now (the innermost open
    `compile_target`, else `jax.default_backend()`)."""
    with _lock:
        return _targets[-1] if _targets else jax.default_backend()


@contextlib.contextmanager
def compile_target(platform: str) -> Iterator[None]:
    """Inside the block, programs traced (by any thread) are built for `platform` (`backend()`):
    for lowering and compiling ahead of time for devices of another platform (a TPU slice's
    `topology_devices` on a CPU host). Nothing can run on them; a program traced inside is for
    compiling only."""
    if platform not in PLATFORMS:
        raise ValueError(f"compile target must be one of {PLATFORMS}, got {platform!r}")
    with _lock:
        _targets.append(platform)
    try:
        yield
    finally:
        with _lock:
            _targets.pop()


def for_devices(devices: Iterable[Any]) -> contextlib.AbstractContextManager[None]:
    """`compile_target` of the devices' platform when it is not this process's default backend
    (devices described for an ahead-of-time compile), else a block that changes nothing."""
    first = next(iter(devices), None)
    kind = None if first is None else first.platform
    if kind is None or kind == jax.default_backend():
        return contextlib.nullcontext()
    return compile_target(kind)


def platform_variant(setting: str, choices: Sequence[str], what: str, elsewhere: str) -> str:
    """`setting` when it names a variant; for "auto", "cpu" when `backend()` is "cpu"
    (deterministic for a process: its default platform, or the compile target), else
    `elsewhere` (GPU and TPU). A setting outside `choices` is a `ValueError` naming `what`."""
    if setting not in choices:
        raise ValueError(f"{what} must be one of {tuple(choices)}, got {setting!r}")
    if setting == "auto":
        return "cpu" if backend() == "cpu" else elsewhere
    return setting
