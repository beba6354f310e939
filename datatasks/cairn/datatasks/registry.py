"""Registries of tasks and mixtures: a default global one, plus scoped `Registry()` objects.

A name is unique within a registry across tasks and mixtures; adding it twice is an
error, and looking up an unknown name is an error that lists the closest names. This
module stores providers without knowing their classes (it imports neither `task` nor
`mixture`); the seqio-style `TaskRegistry`/`MixtureRegistry`, which build them, live in
`seqio_registries.py` above both.
"""

from __future__ import annotations

import threading
from typing import Any

from cairn.datatasks.errors import DataTasksError, unknown


class Registry:
    """Tasks and mixtures by name. `Registry()` makes a scope of its own."""

    def __init__(self):
        self._tasks: dict[str, Any] = {}
        self._mixtures: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __reduce__(self) -> Any:
        """Pickles (for worker processes, e.g. Grain's) without the lock; the default
        registry by reference, so a worker gets its own process's global registry."""
        if self is DEFAULT_REGISTRY:
            return (_default_registry, ())
        return (_restore, (self._tasks, self._mixtures))

    def _add(self, table: dict, obj: Any, kind: str) -> Any:
        name = getattr(obj, "name", None)
        if not isinstance(name, str) or not name:
            raise DataTasksError(f"a {kind} needs a non-empty string name, got {name!r}")
        with self._lock:
            if name in self._tasks or name in self._mixtures:
                other = "task" if name in self._tasks else "mixture"
                raise DataTasksError(
                    f"{kind} {name!r}: a {other} of that name is already "
                    f"registered; remove it first or pick another name"
                )
            table[name] = obj
        return obj

    def add_task(self, task: Any) -> Any:
        """Registers a `Task`; returns it."""
        return self._add(self._tasks, task, "task")

    def add_mixture(self, mixture: Any) -> Any:
        """Registers a `Mixture`; returns it."""
        return self._add(self._mixtures, mixture, "mixture")

    def get_task(self, name: str) -> Any:
        try:
            return self._tasks[name]
        except KeyError:
            raise unknown("task", name, self._tasks) from None

    def get_mixture(self, name: str) -> Any:
        try:
            return self._mixtures[name]
        except KeyError:
            raise unknown("mixture", name, self._mixtures) from None

    def get(self, name: str) -> Any:
        """The task or mixture called `name`."""
        if name in self._tasks:
            return self._tasks[name]
        if name in self._mixtures:
            return self._mixtures[name]
        raise unknown("task or mixture", name, [*self._tasks, *self._mixtures])

    def remove(self, name: str) -> None:
        with self._lock:
            if self._tasks.pop(name, None) is None and self._mixtures.pop(name, None) is None:
                raise unknown("task or mixture", name, [*self._tasks, *self._mixtures])

    def task_names(self) -> list[str]:
        return sorted(self._tasks)

    def mixture_names(self) -> list[str]:
        return sorted(self._mixtures)

    def __contains__(self, name: str) -> bool:
        return name in self._tasks or name in self._mixtures

    def reset(self) -> None:
        with self._lock:
            self._tasks.clear()
            self._mixtures.clear()


DEFAULT_REGISTRY = Registry()


def _default_registry() -> Registry:
    return DEFAULT_REGISTRY


def _restore(tasks: dict[str, Any], mixtures: dict[str, Any]) -> Registry:
    registry = Registry()
    registry._tasks, registry._mixtures = tasks, mixtures
    return registry


def get_mixture_or_task(name: str, registry: Registry | None = None) -> Any:
    """The task or mixture `name` in `registry` (default: the global one)."""
    return (registry or DEFAULT_REGISTRY).get(name)
