"""Platform-gated choices: a setting of "auto" resolved by the process's default backend."""

from __future__ import annotations

from collections.abc import Sequence

import jax


def platform_variant(setting: str, choices: Sequence[str], what: str, elsewhere: str) -> str:
    """`setting` when it names a variant; for "auto", "cpu" when `jax.default_backend()` is "cpu"
    (deterministic for a process: its default platform), else `elsewhere` (GPU and TPU). A
    setting outside `choices` is a `ValueError` naming `what`."""
    if setting not in choices:
        raise ValueError(f"{what} must be one of {tuple(choices)}, got {setting!r}")
    if setting == "auto":
        return "cpu" if jax.default_backend() == "cpu" else elsewhere
    return setting
