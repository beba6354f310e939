"""The run's optimizer from the config's `optimizer.*` keys (`cairn.trainer.OptimizerConfig`), and
the check that every parameter pattern (`optimizer.freeze`, `optimizer.groups`,
`optimizer.no_decay`) matches a parameter of the model: a `ConfigError` naming the pattern."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cairn.launchers import schema
from cairn.launchers.validation import ConfigError, library_config


def parse_groups(entries: Sequence[str]) -> tuple[Any, ...]:
    """`optimizer.groups` entries 'regex=scale' as `ParamGroup`s."""
    from cairn.trainer import ParamGroup

    groups = []
    for entry in entries:
        pattern, sep, scale = str(entry).rpartition("=")
        try:
            if not sep or not pattern:
                raise ValueError("expected 'regex=learning_rate_scale'")
            groups.append(ParamGroup(pattern, float(scale)))
        except ValueError as e:
            raise ConfigError("optimizer.groups", f"entry {entry!r}: {e}") from None
    return tuple(groups)


def _check_regexes(key: str, patterns: Sequence[str]) -> None:
    from cairn.trainer.param_groups import compile_pattern

    for pattern in patterns:
        try:
            compile_pattern(pattern)
        except ValueError as e:
            raise ConfigError(key, str(e)) from None


def optimizer_config(keys: schema.Config) -> Any:
    """The `OptimizerConfig` of `optimizer.*` (`ConfigError` naming the bad key): `RunSpec.optimizer`."""
    from cairn.trainer import OptimizerConfig
    from cairn.trainer.adafactor_axes import factor_rules

    opt = keys.optimizer
    freeze, no_decay = tuple(opt.freeze), tuple(opt.no_decay)
    _check_regexes("optimizer.freeze", freeze)
    _check_regexes("optimizer.no_decay", no_decay)
    rules = {str(k): str(v) for k, v in opt.factor_rules.items()}
    try:
        factor_rules(rules)
    except ValueError as e:
        raise ConfigError("optimizer.factor_rules", str(e)) from None
    # The keys named like OptimizerConfig's fields feed them (name, b1, ..., no_decay, freeze).
    return library_config(OptimizerConfig, opt, "optimizer", factor_rules=rules, groups=parse_groups(opt.groups))


def check_patterns(opt: Any, paths: Sequence[str]) -> None:
    """Every pattern of `optimizer.freeze` and `optimizer.groups` (and of `optimizer.no_decay`
    when weight decay is on) of the `OptimizerConfig` `opt` matches one of the parameter `paths`,
    else a `ConfigError`."""
    from cairn.trainer.param_groups import matches_any, unmatched

    checked = [("optimizer.freeze", opt.freeze), ("optimizer.groups", tuple(g.pattern for g in opt.groups))]
    if opt.weight_decay:
        checked.append(("optimizer.no_decay", opt.no_decay))
    for key, patterns in checked:
        for pattern in unmatched(patterns, paths):
            examples = ", ".join(paths[:3])
            raise ConfigError(
                key, f"pattern {pattern!r} matches no parameter (paths look like {examples}, ... of {len(paths)})"
            )
    if opt.freeze and all(matches_any(opt.freeze)(p) for p in paths):
        raise ConfigError("optimizer.freeze", f"freezes every parameter {opt.freeze}: nothing would train")


def check_param_patterns(opt: Any, trainer: Any, batch: Any) -> None:
    """`check_patterns` of the `OptimizerConfig` `opt` against the paths of the parameters the
    `trainer` sets up for `batch` (`Trainer.setup`: abstract, nothing allocated, done once for
    the run); nothing is traced when no pattern needs checking, except for a LoRA model
    (`frozen_model` set): its setup matches `model.lora.targets` against the base model's kernels
    (`cairn.models.lora.targets`), a target matching none a `ConfigError` naming the key; its
    parameters are the adapters."""
    if getattr(trainer.model, "frozen_model", None) is not None:
        from cairn.models.lora import LoraTargetError

        try:
            trainer.setup(batch)
        except LoraTargetError as e:
            raise ConfigError("model.lora.targets", str(e)) from None
    if not (opt.freeze or opt.groups or (opt.weight_decay and opt.no_decay)):
        return
    from cairn.trainer.param_groups import param_paths

    check_patterns(opt, param_paths(trainer.setup(batch).params))
