"""Parameters chosen by regular expressions on their paths: the weight-decay mask, frozen
parameters and per-group optimizers (`optax.multi_transform`).

A parameter's path joins its tree keys with '/' ('decoder/layers/mlp/wi/kernel'); a pattern
selects the parameters it matches anywhere in the path (`re.search`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import optax

from cairn.partitioning.tree import path_str

# Norm scales, biases and embeddings: no weight decay by default.
DEFAULT_NO_DECAY: tuple[str, ...] = (r"(^|/)(scale|bias|embedding)$",)
FROZEN = "frozen"
DEFAULT_GROUP = "default"


@dataclasses.dataclass(frozen=True)
class ParamGroup:
    """Parameters matching `pattern` trained with the learning rate times `learning_rate_scale`."""

    pattern: str
    learning_rate_scale: float = 1.0

    def __post_init__(self):
        compile_pattern(self.pattern)
        if not self.learning_rate_scale > 0:
            raise ValueError(
                f"ParamGroup {self.pattern!r}: learning_rate_scale must be > 0, got {self.learning_rate_scale}"
            )


def compile_pattern(pattern: str) -> re.Pattern:
    """`re.compile(pattern)`; `ValueError` naming the pattern when it is not a valid regex."""
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ValueError(f"invalid parameter pattern {pattern!r}: {e}") from None


def param_paths(params: Any) -> list[str]:
    """Every parameter's path, in tree order."""
    return [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


def unmatched(patterns: Sequence[str], paths: Sequence[str]) -> list[str]:
    """The patterns that match none of `paths`."""
    return [p for p in patterns if not any(compile_pattern(p).search(path) for path in paths)]


def matches_any(patterns: Sequence[str]) -> Callable[[str], bool]:
    """A predicate on paths: does any of `patterns` match?"""
    compiled = [compile_pattern(p) for p in patterns]
    return lambda path: any(c.search(path) for c in compiled)


def path_mask(params: Any, predicate: Callable[[str], bool]) -> Any:
    """A tree of bools like `params`: `predicate(path)` per leaf."""
    return jax.tree_util.tree_map_with_path(lambda p, _: bool(predicate(path_str(p))), params)


def decay_mask(no_decay: Sequence[str]) -> Callable[[Any], Any]:
    """optax's `mask` for `add_decayed_weights`: True (decay) where no `no_decay` pattern matches."""
    excluded = matches_any(no_decay)
    return lambda params: path_mask(params, lambda path: not excluded(path))


def group_label(path: str, freeze: Sequence[str], groups: Sequence[ParamGroup]) -> str:
    """A parameter's label: `FROZEN` if a freeze pattern matches, else 'group_<i>' of the first
    matching group, else `DEFAULT_GROUP`."""
    if matches_any(freeze)(path):
        return FROZEN
    for i, group in enumerate(groups):
        if compile_pattern(group.pattern).search(path):
            return f"group_{i}"
    return DEFAULT_GROUP


def grouped(
    make: Callable[[float], optax.GradientTransformation],
    freeze: Sequence[str] = (),
    groups: Sequence[ParamGroup] = (),
) -> optax.GradientTransformation:
    """`make(1.0)` for every parameter, or with `freeze`/`groups` an `optax.multi_transform`:
    frozen parameters get zero updates (`optax.set_to_zero`, no optimizer state), group i its own
    `make(groups[i].learning_rate_scale)`, the rest `make(1.0)`."""
    if not freeze and not groups:
        return make(1.0)
    transforms = {DEFAULT_GROUP: make(1.0), FROZEN: optax.set_to_zero()}
    for i, group in enumerate(groups):
        transforms[f"group_{i}"] = make(group.learning_rate_scale)

    def labels(params):
        return jax.tree_util.tree_map_with_path(lambda p, _: group_label(path_str(p), freeze, groups), params)

    return optax.multi_transform(transforms, labels)


def scaled(schedule: Any, factor: float) -> Any:
    """The learning rate (a float or a function of the step) times `factor`."""
    if factor == 1.0:
        return schedule
    if callable(schedule):
        return lambda step: schedule(step) * factor
    return schedule * factor
