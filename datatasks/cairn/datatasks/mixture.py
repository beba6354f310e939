"""`Mixture`: tasks (or other mixtures) sampled at normalised rates."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.lazy_tf import tf
from cairn.datatasks.registry import DEFAULT_REGISTRY, Registry
from cairn.datatasks.sources import ShardInfo
from cairn.datatasks.stats import DataStats
from cairn.datatasks.task import Task
from cairn.datatasks.tf_data import map_inline, pipeline_options

Rate = float | int | Callable[[Task], float]


def _derive(seed: int, i: int) -> int:
    """A per-task seed from the mixture seed (integer mixing, no hash())."""
    return (seed * 0x9E3779B1 + 0x85EBCA6B * (i + 1)) % (2**31 - 1)


class Mixture:
    """Tasks sampled at rates. Entries are names, `Task`s, `Mixture`s, or `(entry, rate)`.

    A rate is a number or a callable `rate(task) -> float`; rates are normalised to sum
    to 1. A nested mixture with rate `r` spreads `r` over its own tasks in proportion to
    their normalised rates. Names are resolved in `registry` (default: the global one).
    """

    def __init__(
        self, name: str, tasks: Sequence[Any], default_rate: Rate | None = None, registry: Registry | None = None
    ):
        self.name = name
        self._registry = registry or DEFAULT_REGISTRY
        if not tasks:
            raise DataTasksError(f"mixture {name!r} has no tasks")
        weights: dict[str, float] = {}
        self._tasks: dict[str, Task] = {}
        for entry in tasks:
            item, rate = entry if isinstance(entry, tuple) else (entry, default_rate)
            obj = self._registry.get(item) if isinstance(item, str) else item
            if rate is None:
                raise DataTasksError(f"mixture {name!r}: no rate for {getattr(obj, 'name', obj)!r} and no default_rate")
            if isinstance(obj, Mixture):
                value = float(rate(obj) if callable(rate) else rate)
                for t, r in obj.rates.items():
                    self._add(weights, obj.tasks[t], value * r)
            elif isinstance(obj, Task):
                self._add(weights, obj, float(rate(obj) if callable(rate) else rate))
            else:
                raise DataTasksError(f"mixture {name!r}: {item!r} is not a task or mixture")
        total = sum(weights.values())
        if total <= 0 or any(w < 0 for w in weights.values()):
            raise DataTasksError(f"mixture {name!r}: rates must be >= 0 with a positive sum, got {weights}")
        self._rates = {k: w / total for k, w in weights.items()}
        self._check_features()

    def _add(self, weights: dict, task: Task, rate: float) -> None:
        weights[task.name] = weights.get(task.name, 0.0) + rate
        self._tasks[task.name] = task

    def _check_features(self) -> None:
        first = next(iter(self._tasks.values()))
        for t in self._tasks.values():
            for k, f in first.output_features.items():
                g = t.output_features.get(k)
                if g is not None and g.vocabulary != f.vocabulary:
                    raise DataTasksError(
                        f"mixture {self.name!r}: feature {k!r} of task "
                        f"{t.name!r} has another vocabulary than {first.name!r}"
                    )

    def __repr__(self) -> str:
        return f"Mixture({self.name!r}, {self._rates})"

    @property
    def tasks(self) -> dict[str, Task]:
        return dict(self._tasks)

    @property
    def rates(self) -> dict[str, float]:
        """Normalised rates by task name."""
        return dict(self._rates)

    @property
    def output_features(self) -> Mapping[str, Any]:
        return next(iter(self._tasks.values())).output_features

    def get_dataset(
        self,
        sequence_length: Mapping[str, int] | None = None,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
        num_epochs: int | None = None,
        stats: DataStats | None = None,
        **kwargs: Any,
    ) -> tf.data.Dataset:
        """Samples the tasks' datasets at the rates (each task repeats `num_epochs`)."""
        seed = 0 if seed is None else int(seed)
        names = sorted(self._tasks)
        keys = set.intersection(*(set(self._tasks[n].output_features) for n in names))
        datasets = []
        for i, n in enumerate(names):
            ds = self._tasks[n].get_dataset(
                sequence_length,
                split,
                shuffle=shuffle,
                seed=_derive(seed, i),
                shard_info=shard_info,
                num_epochs=num_epochs,
                stats=stats,
                **kwargs,
            )
            datasets.append(map_inline(ds, lambda x: {k: x[k] for k in sorted(keys) if k in x}))
        ds = (
            datasets[0]
            if len(datasets) == 1
            else tf.data.Dataset.sample_from_datasets(
                datasets, weights=[self._rates[n] for n in names], seed=seed, stop_on_empty_dataset=False
            )
        )
        return ds.with_options(pipeline_options())
