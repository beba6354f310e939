"""seqio's `TaskRegistry`/`MixtureRegistry`: static facades over `DEFAULT_REGISTRY`.

They build `Task`s and `Mixture`s, so they sit above `task`, `mixture` and `registry`
(which imports neither), keeping the module graph acyclic.
"""

from __future__ import annotations

from typing import Any

from cairn.datatasks.mixture import Mixture
from cairn.datatasks.registry import DEFAULT_REGISTRY
from cairn.datatasks.task import Task


class TaskRegistry:
    """seqio-style facade over the tasks of the default registry."""

    @staticmethod
    def add(name: str, source: Any, output_features: Any, preprocessors: Any = (), **kwargs: Any) -> Any:
        """Builds a `Task` and registers it; returns the task."""
        return DEFAULT_REGISTRY.add_task(
            Task(name, source, output_features=output_features, preprocessors=preprocessors, **kwargs)
        )

    @staticmethod
    def add_provider(task: Any) -> Any:
        return DEFAULT_REGISTRY.add_task(task)

    @staticmethod
    def get(name: str) -> Any:
        return DEFAULT_REGISTRY.get_task(name)

    @staticmethod
    def remove(name: str) -> None:
        DEFAULT_REGISTRY.get_task(name)
        DEFAULT_REGISTRY.remove(name)

    @staticmethod
    def names() -> list[str]:
        return DEFAULT_REGISTRY.task_names()


class MixtureRegistry:
    """seqio-style facade over the mixtures of the default registry."""

    @staticmethod
    def add(name: str, tasks: Any, default_rate: Any = None, **kwargs: Any) -> Any:
        """Builds a `Mixture` over registered tasks and registers it; returns it."""
        return DEFAULT_REGISTRY.add_mixture(
            Mixture(name, tasks, default_rate=default_rate, registry=DEFAULT_REGISTRY, **kwargs)
        )

    @staticmethod
    def add_provider(mixture: Any) -> Any:
        return DEFAULT_REGISTRY.add_mixture(mixture)

    @staticmethod
    def get(name: str) -> Any:
        return DEFAULT_REGISTRY.get_mixture(name)

    @staticmethod
    def remove(name: str) -> None:
        DEFAULT_REGISTRY.get_mixture(name)
        DEFAULT_REGISTRY.remove(name)

    @staticmethod
    def names() -> list[str]:
        return DEFAULT_REGISTRY.mixture_names()
