"""The field constructors of the config schema (`cairn.launchers.schema`): `knob` (a key),
`section` (a group of keys) and `library` (allowed values owned by a library, loaded on use).
No JAX, Flax or TensorFlow import (experiment files import the schema)."""

from __future__ import annotations

import copy
import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

Choices = tuple[str, ...] | Callable[[], tuple[str, ...]]


def library(module: str, name: str, extra: tuple[str, ...] = ()) -> Callable[[], tuple[str, ...]]:
    """Allowed values owned by a library: `module.name` (a tuple, the keys of a mapping, or a
    function returning names), plus `extra`, imported only when called."""

    def load() -> tuple[str, ...]:
        value = getattr(importlib.import_module(module), name)
        return tuple(value() if callable(value) else value) + extra

    load.__doc__ = f"{module}.{name}" + (f" + {extra}" if extra else "")
    return load


def knob(
    default: Any,
    help: str,
    *,
    choices: Choices | None = None,
    min: float | None = None,
    or_minus_one: bool = False,
    keys: Choices | None = None,
    free_form: bool = False,
    owner: str = "",
) -> Any:
    """A config key: a dataclass field whose metadata describes it (see the module docstring)."""
    meta = {
        "default": default,
        "help": help,
        "choices": choices,
        "min": min,
        "or_minus_one": or_minus_one,
        "keys": keys,
        "free_form": free_form,
        "owner": owner,
    }
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def section(cls: type, help: str) -> Any:
    """A section of keys (the dataclass `cls`)."""
    return dataclasses.field(default_factory=cls, metadata={"section": cls, "help": help})
