"""The model-family registry: what callers need to know about each value of `model.kind`.

A `ModelFamily` holds, for one value of an experiment's `model.kind`, its config class,
model and network classes, presets, Hugging Face converter (None where there is none),
parameter count, and the facts the launchers act on (task features, how decoding is fed,
what the post-training samples are). Callers ask the family instead of comparing kind
strings:

    family = get_family(config.model.kind)
    lengths = {k: lengths[k] for k in family.features}
    batch = family.decode_batch(prompts)

Each family is one package (config, network, presets, Hugging Face interchange) whose `family`
module makes one `register_family(ModelFamily(...))` call; the families of cairn.models are those
of `FAMILY_PACKAGES`, registered on the first lookup. `families()` lists every family (those of
`FAMILY_PACKAGES` in its order, then others in the order they registered); `get_family(name)`
and `family_of(config)` (by the config's class) find one; `PRESETS` and `get_preset` reach every
family's presets.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from cairn.models.transformer_config import ModelConfig

# The packages of the families that ship with cairn.models, in registry order; each one's
# `family` module registers it. A new family is a package and a line here.
FAMILY_PACKAGES = ("cairn.models.t5", "cairn.models.gpt", "cairn.models.llama")

# `ModelFamily.samples`: what post-training shows of a trained model.
SAMPLES_EVAL_PREDICTIONS = "eval_predictions"  # evaluation examples with the model's predictions
SAMPLES_PROMPT_CONTINUATIONS = "prompt_continuations"  # `post_training.prompts`, continued


class UnknownFamilyError(KeyError):
    """`get_family` of a name that is not registered (its message names the known families)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclasses.dataclass(frozen=True)
class HFConverter:
    """Hugging Face `transformers` interchange of a family (see each family package's `hf` module)."""

    import_dir: Callable[..., tuple[Any, Any]]  # (directory, **config_overrides) -> (config, params)
    export_dir: Callable[[Any, Any, str], str]  # (params, config, directory) -> directory
    config_from_dir: Callable[..., Any]  # (directory, **overrides) -> config, weights not loaded


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """One model family, named by its `model.kind` value.

    * `features`: the task features the model reads, each needing a `data.sequence_length`;
    * `feature_converter`: the name of the `cairn.datatasks` feature converter class;
    * `input_feature`: the feature the model is conditioned on (the encoder input), or None
      when it only continues `targets`: then `predict_batch` takes a prompt of target tokens
      and returns it followed by the continuation (`continues_prompt`);
    * `decode_batch(prompts)`: the `predict_batch` argument for `[b, length]` prompt tokens;
    * `samples`: `SAMPLES_EVAL_PREDICTIONS` or `SAMPLES_PROMPT_CONTINUATIONS`;
    * `pretrain_optimizer`: `optimizer.*` settings of a pretraining run at scale (t5x's for T5);
    * `preset_configs`: the family's named configurations (`presets` lists their names);
    * `training_flops(config, lengths)`: training FLOPs of one example (`cairn.models.flops`;
      None: the family declares none, and MFU is not reported for it).
    """

    name: str
    description: str
    config_class: type[ModelConfig]
    model_class: type
    network_class: type
    features: tuple[str, ...]
    feature_converter: str
    input_feature: str | None
    decode_batch: Callable[[Any], Any]
    samples: str
    hf: HFConverter | None
    count_params: Callable[[Any], int]
    pretrain_optimizer: tuple[tuple[str, Any], ...] = ()
    preset_configs: Mapping[str, ModelConfig] = dataclasses.field(default_factory=dict, hash=False)
    training_flops: Callable[[Any, Mapping[str, int]], float] | None = None

    @property
    def continues_prompt(self) -> bool:
        """Whether decoding continues a prompt of target tokens (the output starts with it)."""
        return self.input_feature is None

    @property
    def presets(self) -> tuple[str, ...]:
        """The names of the presets (`cairn.models.PRESETS`) of this family, in registry order."""
        return tuple(self.preset_configs)

    def make_model(self, config: ModelConfig, **kwargs: Any) -> Any:
        """`model_class(config, **kwargs)` (`label_smoothing`, `z_loss`, `loss_normalizing_factor`);
        TypeError when `config` belongs to another family."""
        if type(config) is not self.config_class:
            raise TypeError(
                f"model family {self.name!r} needs a {self.config_class.__name__}, got {type(config).__name__}"
            )
        return self.model_class(config, **kwargs)


def prompt_batch(prompts: Any) -> Any:
    """`decode_batch` of a family that continues prompts of target tokens: the prompts themselves."""
    return prompts


# AdamW with a cosine schedule to a tenth of the peak (GPT-3 / Llama 2 pretraining settings):
# `pretrain_optimizer` of the decoder-only language models.
LM_PRETRAIN_OPTIMIZER = (
    ("name", "adamw"),
    ("schedule", "cosine"),
    ("learning_rate", 3e-4),
    ("warmup_steps", 2000),
    ("final_learning_rate", 3e-5),
    ("weight_decay", 0.1),
    ("b2", 0.95),
    ("clip_grad_norm", 1.0),
)

_registered: dict[str, ModelFamily] = {}  # in registration order
_builtins = "unloaded"  # "loading" while the family modules of FAMILY_PACKAGES import, then "loaded"
_added_networks: set[type] = set()  # the config classes register_family added to params.NETWORKS


def _registry() -> dict[str, ModelFamily]:
    """The registered families, after importing the `family` module of each of `FAMILY_PACKAGES`
    (once; each registers its family, calling this again, which then returns at once). A module that
    fails to import raises here, and the next lookup tries again."""
    global _builtins
    if _builtins == "unloaded":
        _builtins = "loading"
        try:
            for package in FAMILY_PACKAGES:
                importlib.import_module(f"{package}.family")
        except BaseException:
            _builtins = "unloaded"
            raise
        _builtins = "loaded"
    return _registered


def _rank(family: ModelFamily) -> int:
    """Registry order: a family of `FAMILY_PACKAGES` by its package's place there, whatever order
    their modules were imported in; any other after them (`sorted` keeps their registration order)."""
    module = family.config_class.__module__
    for i, package in enumerate(FAMILY_PACKAGES):
        if module == package or module.startswith(package + "."):
            return i
    return len(FAMILY_PACKAGES)


def register_family(family: ModelFamily) -> ModelFamily:
    """Adds `family` to the registry and returns it. ValueError when its name, its config class or
    one of its preset names is already registered (the message names the family that holds it).

    `params.network_for` (what `DecoderOnlyModel`, `count_params` and `logical_axes` build) then
    knows its network too."""
    from cairn.models import params

    for other in _registry().values():
        if other.name == family.name:
            raise ValueError(f"model family {family.name!r} is already registered")
        if other.config_class is family.config_class:
            raise ValueError(
                f"model family {family.name!r}: config class {family.config_class.__name__} is already "
                f"registered by model family {other.name!r}"
            )
        shared = [name for name in family.preset_configs if name in other.preset_configs]
        if shared:
            raise ValueError(
                f"model family {family.name!r}: preset {shared[0]!r} is already registered by "
                f"model family {other.name!r}"
            )
    if family.config_class not in params.NETWORKS:
        params.NETWORKS[family.config_class] = family.network_class
        _added_networks.add(family.config_class)
    _registered[family.name] = family
    return family


def unregister_family(name: str) -> ModelFamily:
    """Removes the family called `name` from the registry and returns it (for tests and plugins
    that register a family for a while); `UnknownFamilyError` when there is none."""
    from cairn.models import params

    family = get_family(name)
    del _registered[name]
    if family.config_class in _added_networks:
        _added_networks.discard(family.config_class)
        del params.NETWORKS[family.config_class]
    return family


def families() -> tuple[ModelFamily, ...]:
    """Every registered family, in registry order."""
    return tuple(sorted(_registry().values(), key=_rank))


def names() -> tuple[str, ...]:
    """The family names (the allowed `model.kind` values), in registry order."""
    return tuple(f.name for f in families())


def get_family(name: str) -> ModelFamily:
    """The family called `name`; `UnknownFamilyError` (a KeyError) naming the known families otherwise."""
    registry = _registry()
    if name not in registry:
        raise UnknownFamilyError(f"unknown model family {name!r}; known families: {', '.join(names())}")
    return registry[name]


def family_of(config: Any) -> ModelFamily:
    """The family whose config class is `config`'s class; TypeError naming the config classes otherwise."""
    by_class = {f.config_class: f for f in families()}
    if type(config) in by_class:
        return by_class[type(config)]
    known = ", ".join(f.config_class.__name__ for f in families())
    raise TypeError(f"{type(config).__name__} is not the config of a model family (known: {known})")


class _Presets(Mapping[str, ModelConfig]):
    """Every registered family's presets, name -> config, in registry order (read-only; it follows
    the registry)."""

    def _merged(self) -> dict[str, ModelConfig]:
        return {name: config for f in families() for name, config in f.preset_configs.items()}

    def __getitem__(self, name: str) -> ModelConfig:
        for f in families():
            if name in f.preset_configs:
                return f.preset_configs[name]
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._merged())

    def __len__(self) -> int:
        return len(self._merged())

    def __repr__(self) -> str:
        return f"PRESETS({self._merged()!r})"


PRESETS: Mapping[str, ModelConfig] = _Presets()


def get_preset(name: str, **overrides: Any) -> Any:
    """The preset `name` (of any family), with `overrides` (e.g. `scan_layers=True`) applied."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
    config = PRESETS[name]
    return config.replace(**overrides) if overrides else config
