"""What the trainer needs of a model, and how it gets parameters and their logical specs."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import PartitionSpec


@runtime_checkable
class TrainableModel(Protocol):
    """A model the trainer can train.

    `init(rng, batch)` returns one of: a params tree whose leaves carry logical axis metadata
    (`nn.LogicallyPartitioned` boxes); or a pair `(params, logical_specs)`. A model that instead
    has `init_boxed(rng, input_length, target_length)` (cairn.models) is called with the batch's
    lengths. `loss_fn(params, batch, dropout_rng)` returns `(scalar loss, dict of scalar metrics)`.
    Optional: `flops_per_token` (a number, or a callable taking no arguments) - training FLOPs
    (forward + backward) per target token; `init_model_state` (`init_model_state` below) - state
    the step carries beside the params and replaces with its gradient, given to
    `loss_fn(..., collections=model_state)`.
    """

    def loss_fn(self, params: Any, batch: Mapping[str, Any], dropout_rng: Any) -> tuple[Any, Mapping[str, Any]]: ...


def _is_box(x: Any) -> bool:
    return isinstance(x, nn.meta.AxisMetadata)


def _init_args(model: Any, batch: Mapping[str, Any]) -> tuple[Any, ...]:
    """What the model's init takes after the rng: the batch's lengths for a model with `init_boxed`
    (cairn.models.EncoderDecoderModel / DecoderOnlyModel: encoder and decoder, or decoder), else the batch."""
    if not hasattr(model, "init_boxed"):
        return (batch,)
    if "encoder_input_tokens" in batch:
        return np.shape(batch["encoder_input_tokens"])[1], np.shape(batch["decoder_target_tokens"])[1]
    key = "decoder_target_tokens" if "decoder_target_tokens" in batch else next(iter(batch))
    return (np.shape(batch[key])[1],)


def _call_init(model: Any, rng: jax.Array, batch: Mapping[str, Any]) -> Any:
    init = model.init_boxed if hasattr(model, "init_boxed") else model.init
    return init(rng, *_init_args(model, batch))


def init_model_state(model: Any, batch: Mapping[str, Any]) -> Any:
    """The model's `init_model_state` for this batch (called with what its init takes after the
    rng): variables the train step carries beside the params and overwrites with their gradient
    (cairn.models' fp8 amax histories, `{collection: tree}`); None for a model without it."""
    fn = getattr(model, "init_model_state", None)
    return None if fn is None else fn(*_init_args(model, batch))


def init_params(model: Any, rng: jax.Array, batch: Mapping[str, Any]) -> tuple[Any, Any]:
    """`(params, logical_specs)` from the model's init (see `TrainableModel`). Params without
    any axis metadata are replicated, with a warning."""
    out = _call_init(model, rng, batch)
    if isinstance(out, tuple) and len(out) == 2 and not _is_box(out[0]):
        return out
    specs = nn.get_partition_spec(out)
    params = nn.meta.unbox(out)
    if not any(_is_box(x) for x in jax.tree.leaves(out, is_leaf=_is_box)):
        if hasattr(model, "logical_axes"):
            return params, model.logical_axes()
        warnings.warn("the model's params carry no logical axis metadata: every parameter is replicated", stacklevel=2)
        specs = jax.tree.map(lambda _: PartitionSpec(), params)
    return params, specs


def model_flops_per_token(model: Any, override: float | None = None) -> float | None:
    """Training FLOPs per token: `override`, else the model's `flops_per_token`, else None."""
    if override is not None:
        return float(override)
    value = getattr(model, "flops_per_token", None)
    if value is None:
        return None
    return float(value() if callable(value) else value)


TOKEN_KEYS = ("decoder_target_tokens", "targets", "target_tokens", "inputs")


def tokens_in_batch(batch: Mapping[str, Any]) -> int:
    """The tokens a step trains on: the size of the batch's target array (t5x feature names
    first), else of its first array's two leading dimensions."""
    for key in TOKEN_KEYS:
        if key in batch:
            return int(np.prod(np.shape(batch[key])))
    first = np.shape(next(iter(batch.values())))
    return int(np.prod(first[:2]))


def sequences_in_batch(batch: Mapping[str, Any]) -> int:
    """Rows in the batch."""
    return int(np.shape(next(iter(batch.values())))[0])


def abstract_init(model: Any, rng: jax.Array, batch: Mapping[str, Any]) -> tuple[Any, Any]:
    """`(param ShapeDtypeStructs, logical_specs)` without allocating the params."""
    traced = trace_init(model, rng, batch)
    return traced.shapes, traced.specs


@dataclasses.dataclass(frozen=True)
class TracedInit:
    """The model's init traced once (`trace_init`): the param `shapes` (ShapeDtypeStructs), their
    logical `specs`, and the trace itself. Calling it with the rng (inside a jitted function)
    replays the traced operations instead of tracing the model again; the program is the one a
    second trace would give, so the params are bit for bit those of `init_params`."""

    jaxpr: Any  # a jax.extend.core.ClosedJaxpr of rng -> the flat params
    out_tree: Any
    shapes: Any
    specs: Any

    def __call__(self, rng: jax.Array) -> Any:
        flat = jax.core.eval_jaxpr(self.jaxpr.jaxpr, self.jaxpr.consts, rng)
        return jax.tree.unflatten(self.out_tree, flat)


def trace_init(model: Any, rng: jax.Array, batch: Mapping[str, Any]) -> TracedInit:
    """`init_params(model, rng, batch)` traced once, without allocating the params: its shapes and
    specs (as `abstract_init`), and a replay for the jitted function that makes them."""
    captured = {}

    def init(r):
        params, specs = init_params(model, r, batch)
        captured["specs"] = specs
        return params

    jaxpr, shapes = jax.make_jaxpr(init, return_shape=True)(rng)
    return TracedInit(jaxpr, jax.tree.structure(shapes), shapes, captured["specs"])


BatchSignature = tuple[tuple[str, tuple[int, ...], str], ...]


def batch_signature(batch: Mapping[str, Any]) -> BatchSignature:
    """`(key path, shape, dtype)` of each array (or `jax.ShapeDtypeStruct`) of a host batch: all
    `Trainer.setup` depends on."""
    leaves = jax.tree_util.tree_flatten_with_path(batch)[0]
    return tuple((jax.tree_util.keystr(path), tuple(np.shape(x)), str(leaf_dtype(x))) for path, x in leaves)


def leaf_dtype(x: Any) -> np.dtype:
    """An array's (or `jax.ShapeDtypeStruct`'s) dtype; a list's as numpy reads it."""
    return np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype
