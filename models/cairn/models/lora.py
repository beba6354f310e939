"""LoRA (Hu et al. 2021) as a parameter transform: every family's dense kernels adapted without
editing a network.

A targeted kernel `W` (a parameter path matched by one of `LoraConfig.targets`, regexes searched
in the `/`-joined path as the optimizer's parameter groups are) gets two factors: `lora_a` of
shape `batch + in + (rank,)` and `lora_b` of shape `batch + (rank,) + out`, where `batch` are
its leading `layers` (scanned) and `expert` (routed MLP) axes, `in` its input axes (the `embed`
axis of a query, key, value or MLP input kernel; the `heads, kv` or `mlp` axes of an output
kernel) and `out` the rest. The update is `W' = W + (alpha / rank) * A @ B` (per batch index;
A, B flattened over in / out). `merge` folds it into the base params (export, evaluation); in
training `LoraModel.loss_fn` hands the adapters to the network as the `layers.LORA` variable
collection, and every adapted kernel computes `x W + (x A) B` through the rank
(`layers.LoraKernel`): the same loss, with no `[in, out]` weight gradient in the backward. No
network is edited: the kernels are read through `layers.kernel` / `layers.Kernel` and applied by
`dense`, `project_heads` and `expert_dense`, which know the adapted kernel.
`lora_a` starts as PEFT's (uniform in `+-1/sqrt(fan_in)`), `lora_b` at zero, so an untrained
adapter leaves the model exactly as it was. The factors carry the kernel's logical axis names
(`in` and `out` axes keep theirs, the rank axis is unnamed), so they shard under the same rules
as the base and a LoRA run works on any mesh the base model does.

`dropout`: each training step zeroes rows of `lora_a` (its input features) with probability
`dropout`, the rest scaled by `1 / (1 - dropout)`: the weight-space form of PEFT's dropout on the
adapter's input, with one mask per step (and per layer and expert) instead of one per token.

`LoraModel(model, config)` is what the trainer trains: its params are the adapters, the base
params are the trainer's frozen tree (`frozen_model` is the base model; not differentiated, no
optimizer state, not checkpointed).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from cairn.models.layers import LORA

# Attention q/k/v/o (T5's self_attention / encoder_decoder_attention / attention, Llama's
# attention/<name>/kernel) and the MLP's kernels (dense, gated, and a routed layer's experts).
DEFAULT_TARGETS: tuple[str, ...] = (
    r"attention/(query|key|value|out)(/kernel)?$",
    r"mlp/(wi|wi_\d+|wo)(/kernel)?$",
)
BATCH_AXES = ("layers", "expert")  # leading axes each index of which gets its own factors
A, B = "lora_a", "lora_b"


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """`rank` (>= 1), `alpha` (the update is scaled by `alpha / rank`), `dropout` in [0, 1)
    (module docstring), `targets`: regexes on parameter paths (`DEFAULT_TARGETS`: attention
    q/k/v/o and the MLP, experts included)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = DEFAULT_TARGETS

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(self.targets))
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"LoraConfig.rank must be an int >= 1, got {self.rank!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0:
            raise ValueError(f"LoraConfig.alpha must be a number > 0, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoraConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if not self.targets:
            raise ValueError("LoraConfig.targets must name at least one parameter pattern")
        for pattern in self.targets:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"LoraConfig.targets: invalid pattern {pattern!r}: {e}") from None

    @property
    def scale(self) -> float:
        """`alpha / rank`, the factor of `A @ B`."""
        return float(self.alpha) / self.rank


class LoraTargetError(ValueError):
    """A target pattern matches no parameter, or a parameter LoRA cannot adapt (named)."""


@dataclasses.dataclass(frozen=True)
class _Split:
    """How a kernel's axes divide: `nb` leading batch axes, then `ni` input axes, then the rest."""

    nb: int
    ni: int


def _split(shape: tuple[int, ...], names: Sequence[str | None]) -> _Split | None:
    """The axes split of a kernel (None: not adaptable, fewer than two non-batch axes)."""
    names = list(names) + [None] * (len(shape) - len(names))
    nb = 0
    while nb < len(shape) and names[nb] in BATCH_AXES:
        nb += 1
    rest = names[nb:]
    if len(rest) < 2:
        return None
    ni = len(rest) - 1 if rest[-1] == "embed" and rest[0] != "embed" else 1
    return _Split(nb, ni)


def _path(key: tuple[str, ...]) -> str:
    return "/".join(str(k) for k in key)


def _flat_specs(specs: Any) -> dict[tuple[str, ...], tuple]:
    flat = traverse_util.flatten_dict(_plain(specs), is_leaf=lambda _, x: isinstance(x, jax.sharding.PartitionSpec))
    return {k: tuple(v) for k, v in flat.items()}


def _plain(tree: Any) -> Any:
    """Nested mappings as plain dicts (flax's FrozenDict included)."""
    if isinstance(tree, Mapping):
        return {k: _plain(v) for k, v in tree.items()}
    return tree


def targets(shapes: Any, specs: Any, config: LoraConfig) -> dict[tuple[str, ...], _Split]:
    """`{path key: split}` of the kernels `config.targets` select in a params tree (`shapes`:
    arrays or ShapeDtypeStructs; `specs`: their logical PartitionSpecs). `LoraTargetError` names a
    pattern that matches no parameter, or a matched parameter with fewer than two non-batch axes."""
    flat = traverse_util.flatten_dict(_plain(shapes))
    names = _flat_specs(specs)
    compiled = [re.compile(p) for p in config.targets]
    out: dict[tuple[str, ...], _Split] = {}
    for pattern, regex in zip(config.targets, compiled):
        hits = [k for k in flat if regex.search(_path(k))]
        if not hits:
            raise LoraTargetError(f"LoRA target {pattern!r} matches no parameter (e.g. {_path(next(iter(flat)))!r})")
        for key in hits:
            split = _split(tuple(flat[key].shape), names.get(key, ()))
            if split is None:
                raise LoraTargetError(
                    f"LoRA target {pattern!r} matches {_path(key)!r} of shape {tuple(flat[key].shape)}, "
                    "which is not a kernel (it needs two axes besides layers/expert)"
                )
            out[key] = split
    return dict(sorted(out.items()))


def _factor_shapes(shape: tuple[int, ...], split: _Split, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    batch, rest = shape[: split.nb], shape[split.nb :]
    return batch + rest[: split.ni] + (rank,), batch + (rank,) + rest[split.ni :]


def _factor_names(names: tuple, ndim: int, split: _Split) -> tuple[tuple, tuple]:
    names = tuple(names) + (None,) * (ndim - len(names))
    batch, rest = names[: split.nb], names[split.nb :]
    return batch + rest[: split.ni] + (None,), batch + (None,) + rest[split.ni :]


def init_adapters(rng: jax.Array, shapes: Any, specs: Any, config: LoraConfig) -> tuple[Any, Any]:
    """`(adapters, adapter_specs)`: for each targeted kernel at path `p`, `p/lora_a` (uniform in
    `+-1/sqrt(fan_in)`, PEFT's kaiming-uniform with a=sqrt(5)) and `p/lora_b` (zeros), in the
    kernel's dtype, with their logical specs. Leaf `i` (sorted paths) draws from `fold_in(rng, i)`."""
    flat = traverse_util.flatten_dict(_plain(shapes))
    names = _flat_specs(specs)
    adapters, adapter_specs = {}, {}
    for i, (key, split) in enumerate(targets(shapes, specs, config).items()):
        leaf = flat[key]
        a_shape, b_shape = _factor_shapes(tuple(leaf.shape), split, config.rank)
        a_names, b_names = _factor_names(names.get(key, ()), len(leaf.shape), split)
        fan_in = int(np.prod(a_shape[split.nb : -1]))
        bound = 1.0 / math.sqrt(fan_in)
        a = jax.random.uniform(jax.random.fold_in(rng, i), a_shape, jnp.float32, -bound, bound)
        adapters[key + (A,)] = a.astype(leaf.dtype)
        adapters[key + (B,)] = jnp.zeros(b_shape, leaf.dtype)
        adapter_specs[key + (A,)] = jax.sharding.PartitionSpec(*a_names)
        adapter_specs[key + (B,)] = jax.sharding.PartitionSpec(*b_names)
    return traverse_util.unflatten_dict(adapters), traverse_util.unflatten_dict(adapter_specs)


def delta(a: jnp.ndarray, b: jnp.ndarray, shape: tuple[int, ...], nb: int) -> jnp.ndarray:
    """`A @ B` per batch index, in float32, shaped like the kernel (`shape`; `nb` batch axes)."""
    batch = shape[:nb]
    rank = a.shape[-1]
    a2 = a.astype(jnp.float32).reshape(*batch, -1, rank)
    b2 = b.astype(jnp.float32).reshape(*batch, rank, -1)
    return jnp.matmul(a2, b2).reshape(shape)


def merge(base: Any, adapters: Any, config: LoraConfig, dropout_rng: jax.Array | None = None) -> Any:
    """The base params with every adapter folded in: `W + (alpha / rank) * A @ B` (computed in
    float32, stored in `W`'s dtype); other parameters as they are. With `dropout_rng` and
    `config.dropout` > 0, rows of each `A` are dropped (module docstring). Used at apply time by
    `LoraModel` and, for export, on a trained adapter (then the result is an ordinary params tree
    of the base model)."""
    flat = traverse_util.flatten_dict(_plain(base))
    flat_adapters = traverse_util.flatten_dict(_plain(adapters))
    kernels = sorted({k[:-1] for k in flat_adapters})
    for i, key in enumerate(kernels):
        if key not in flat:
            raise LoraTargetError(f"the adapter {_path(key)!r} has no kernel in the base params")
        w, a, b = flat[key], flat_adapters[key + (A,)], flat_adapters[key + (B,)]
        nb = a.ndim + b.ndim - 2 - w.ndim  # a: batch + in + (rank,), b: batch + (rank,) + out
        a = _dropped(a, config, dropout_rng, i)
        update = config.scale * delta(a, b, tuple(w.shape), nb)
        flat[key] = (w.astype(jnp.float32) + update).astype(w.dtype)
    return traverse_util.unflatten_dict(flat)


def _dropped(a: jnp.ndarray, config: LoraConfig, dropout_rng: jax.Array | None, i: int) -> jnp.ndarray:
    """`a` with its input rows dropped (the module docstring's dropout; kernel `i` of the sorted
    adapter paths draws from `fold_in(dropout_rng, i)`), or `a` without a key or a dropout."""
    if dropout_rng is None or config.dropout <= 0:
        return a
    keep = jax.random.bernoulli(jax.random.fold_in(dropout_rng, i), 1.0 - config.dropout, a.shape[:-1])
    return jnp.where(keep[..., None], a / (1.0 - config.dropout), 0).astype(a.dtype)


def network_adapters(adapters: Any, config: LoraConfig, dropout_rng: jax.Array | None = None) -> Any:
    """The adapters as the networks read them (the `layers.LORA` variable collection): B scaled
    by `alpha / rank`, A's rows dropped as in `merge`. With them the network computes
    `x W + (x A) B` at every adapted kernel (`layers.LoraKernel`), never `W + A B`."""
    flat = traverse_util.flatten_dict(_plain(adapters))
    out = {}
    for i, key in enumerate(sorted({k[:-1] for k in flat})):
        out[key + (A,)] = _dropped(flat[key + (A,)], config, dropout_rng, i)
        out[key + (B,)] = (flat[key + (B,)] * config.scale).astype(flat[key + (B,)].dtype)
    return traverse_util.unflatten_dict(out)


def adapter_count(adapters: Any) -> int:
    """The number of adapter parameters."""
    return int(sum(np.prod(np.shape(x)) for x in jax.tree.leaves(adapters)))


class LoraModel:
    """A Cairn model (`EncoderDecoderModel` or `DecoderOnlyModel`) trained through LoRA adapters.

    Its params are the adapters (`init_boxed` gives them with logical axis metadata, for the
    trainer's shardings); `frozen_model` is the base model, whose params the trainer holds as its
    frozen tree and passes to `loss_fn(adapters, batch, dropout_rng, frozen)`. `merged(adapters,
    base)` is the base model's params with the adapters folded in (evaluation, decoding, export).
    """

    flops_per_token: Any = None  # training FLOPs per token (MFU), set by whoever knows them

    def __init__(self, model: Any, config: LoraConfig):
        self.frozen_model = model
        self.lora = config
        self.config = model.config

    def _base_boxed(self, *lengths: int) -> Any:
        return jax.eval_shape(lambda: self.frozen_model.init_boxed(jax.random.PRNGKey(0), *lengths))

    def init_boxed(self, rng: jax.Array, *lengths: int) -> Any:
        """The adapters of the base model's params (for inputs of these lengths), each leaf an
        `nn.LogicallyPartitioned` with its logical axis names."""
        boxed = self._base_boxed(*lengths)
        adapters, specs = init_adapters(rng, nn.meta.unbox(boxed), nn.get_partition_spec(boxed), self.lora)
        return jax.tree.map(
            lambda x, s: nn.LogicallyPartitioned(x, tuple(s)),
            adapters,
            specs,
            is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec),
        )

    def init(self, rng: jax.Array, *lengths: int) -> Any:
        """Fresh adapters (deterministic given `rng`)."""
        return nn.meta.unbox(self.init_boxed(rng, *lengths))

    def merged(self, adapters: Any, base: Any) -> Any:
        """The base model's params with the adapters folded in (`merge`)."""
        return merge(base, adapters, self.lora)

    def loss_fn(
        self, params: Any, batch: Mapping[str, Any], dropout_rng: jax.Array | None = None, frozen: Any = None
    ) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
        """The base model's loss with the adapters applied (adapter dropout from `dropout_rng`):
        each adapted kernel computes `x W + (x A) B` (`network_adapters`), which equals the loss of
        `merge`'s params without forming `W + A B` or, in the backward, any `[in, out]` gradient."""
        if frozen is None:
            raise ValueError("LoraModel.loss_fn needs the base params (frozen=...)")
        lora_rng = None if dropout_rng is None else jax.random.fold_in(dropout_rng, 0x10A)
        adapters = network_adapters(params, self.lora, lora_rng)
        return self.frozen_model.loss_fn(frozen, batch, dropout_rng, collections={LORA: adapters})
