"""Errors raised by cairn.datatasks, and the helper that suggests close names."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class DataTasksError(ValueError):
    """Bad input to a task, source, preprocessor or feature converter."""


class FeatureTypeError(DataTasksError):
    """A feature of the wrong kind for what a preprocessor does with it (for example token
    ids where its vocabulary expects text). `Task.preprocess` adds the task's name."""


class UnknownNameError(KeyError, DataTasksError):
    """A task, mixture, split or feature name that is not registered."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly.
        return str(self.args[0]) if self.args else ""


def closest(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The registered names closest to `name` (difflib), best first."""
    candidates = list(candidates)
    found = difflib.get_close_matches(name, candidates, n=n, cutoff=0.5)
    if not found:
        found = difflib.get_close_matches(name, candidates, n=n, cutoff=0.0)
    return found


def unknown(kind: str, name: str, candidates: Iterable[str]) -> UnknownNameError:
    """An `UnknownNameError` naming the closest registered names."""
    candidates = sorted(candidates)
    if not candidates:
        return UnknownNameError(f"unknown {kind} {name!r}: none is registered")
    near = closest(name, candidates)
    return UnknownNameError(f"unknown {kind} {name!r}; closest registered: {', '.join(map(repr, near))}")
