"""Adafactor factored by logical axis names, as t5x's `adafactor.Adafactor` with
`logical_factor_rules` (t5x/adafactor.py: `set_param_axes`, `_parse_rule`, `apply_param_gradient`).

Each parameter's logical axes (`("layers", "embed", "mlp")`) map through factor rules to one
kind per dimension: "row", "column", "batch" or "none". Batch dimensions (scanned `layers`,
attention `heads`) are never averaged over: second moments, update clipping and the parameter
scale are computed per layer and per head. The row and column statistics average the gradient
squares over the column dimensions and the row dimensions. A parameter of rank <= 2 without a
batch dimension falls back to optax's heuristic (its two largest dimensions, if the smaller is at
least `min_dim_size_to_factor`).

The state is optax's `FactoredState` (`v_row`, `v_col`, `v`: the param's shape with the column
dimensions, the row dimensions, or none removed), so `cairn.partitioning` shards it like
`optax.adafactor`'s. Parameters are found by their path ('decoder/layers/mlp/wi/kernel'), so the
transformation works inside `optax.multi_transform` (masked leaves are skipped).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cairn.partitioning.tree import is_spec, path_str

ROW, COLUMN, BATCH, NONE = "row", "column", "batch", "none"
FACTOR_KINDS = (ROW, COLUMN, BATCH, NONE)

# t5x's `standard_logical_factor_rules()`, except `heads` (and `multiquery_heads`): batch-like
# here, so attention kernels are factored within each head (t5x: column); plus `expert`
# (mixture-of-experts kernels `[expert, embed, mlp]`): batch-like, each expert factored alone.
STANDARD_FACTOR_RULES: dict[str, str] = {
    "vocab": COLUMN,
    "embed": ROW,
    "mlp": COLUMN,
    "heads": BATCH,
    "multiquery_heads": BATCH,
    "kv": COLUMN,
    "joined_kv": COLUMN,
    "relpos_buckets": NONE,
    "layers": BATCH,
    "stack": BATCH,
    "expert": BATCH,
    "q_wi_fused": COLUMN,
    "o_wo_fused": COLUMN,
    "kv_fused": COLUMN,
    "layer_norm_scale": NONE,
    "mlp_activations": COLUMN,
}

FactorMap = Mapping[str, tuple[str, ...]]


def factor_rules(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """`STANDARD_FACTOR_RULES` with `overrides` (axis name -> kind); `ValueError` naming a bad kind."""
    rules = dict(STANDARD_FACTOR_RULES)
    for name, kind in (overrides or {}).items():
        if kind not in FACTOR_KINDS:
            raise ValueError(f"factor rule for axis {name!r} must be one of {FACTOR_KINDS}, got {kind!r}")
        rules[name] = kind
    return rules


def factor_rule(axes: tuple[str | None, ...], rules: Mapping[str, str], path: str = "<param>") -> tuple[str, ...]:
    """One kind per dimension of a parameter with logical `axes` (t5x's `apply_rules`): a
    parameter without both a row and a column dimension is not factored (its row/column
    dimensions become "none"; batch dimensions stay). Unnamed dimensions are "none"."""
    kinds = []
    for axis in axes:
        if axis is None:
            kinds.append(NONE)
        elif axis in rules:
            kinds.append(rules[axis])
        else:
            raise ValueError(f"no Adafactor factor rule for logical axis {axis!r} of parameter {path} (axes {axes})")
    if ROW in kinds and COLUMN in kinds and NONE in kinds:
        raise ValueError(f"incomplete Adafactor factor rule {tuple(kinds)} for parameter {path} (axes {axes})")
    if ROW not in kinds or COLUMN not in kinds:
        kinds = [NONE if k in (ROW, COLUMN) else k for k in kinds]
    return tuple(kinds)


def logical_factor_map(param_axes: Any, rules: Mapping[str, str] | None = None) -> dict[str, tuple[str, ...]]:
    """`{param path: factor rule}` from a tree of logical specs (PartitionSpecs or tuples of
    names, as `init_params` returns) and axis rules (default `STANDARD_FACTOR_RULES`)."""
    rules = factor_rules() if rules is None else rules
    leaves = jax.tree_util.tree_flatten_with_path(param_axes, is_leaf=is_spec)[0]
    return {path_str(p): factor_rule(tuple(spec), rules, path_str(p)) for p, spec in leaves}


def factored_dims(
    rule: tuple[str, ...], shape: tuple[int, ...], factored: bool = True, min_dim_size_to_factor: int = 128
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], tuple[int, ...]] | None]:
    """`(averaging dims, (row dims, column dims) or None)` of a parameter (t5x's `_parse_rule`).
    Averaging dims are every dimension but the batch ones. Rank <= 2 without batch dims: the
    heuristic (two largest dimensions `(d1,), (d0,)`, d0 the largest, if d1 >= the minimum)."""
    if len(rule) != len(shape):
        raise ValueError(f"factor rule {rule} has rank {len(rule)}, the parameter's shape {shape} {len(shape)}")
    batch = [i for i, k in enumerate(rule) if k == BATCH]
    averaging = tuple(i for i in range(len(shape)) if i not in batch)
    if not factored:
        return averaging, None
    if len(shape) <= 2 and not batch:
        if len(shape) < 2:
            return averaging, None
        order = np.argsort(shape)
        if shape[order[-2]] < min_dim_size_to_factor:
            return averaging, None
        return averaging, ((int(order[-2]),), (int(order[-1]),))
    rows = tuple(i for i, k in enumerate(rule) if k == ROW)
    cols = tuple(i for i, k in enumerate(rule) if k == COLUMN)
    return averaging, ((rows, cols) if rows and cols else None)


def _rule(factor_map: FactorMap, path: str) -> tuple[str, ...]:
    if path not in factor_map:
        raise ValueError(f"the Adafactor factor map has no rule for parameter {path}")
    return tuple(factor_map[path])


def _delete(shape: tuple[int, ...], dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(s for i, s in enumerate(shape) if i not in dims)


def scale_by_factored_rms_axes(
    factor_map: FactorMap,
    factored: bool = True,
    decay_rate: float = 0.8,
    step_offset: int = 0,
    min_dim_size_to_factor: int = 128,
    epsilon1: float = 1e-30,
) -> optax.GradientTransformation:
    """Gradients divided by the root of their (factored) second moments, the moments decayed with
    beta2 = 1 - (step - step_offset + 1)^-decay_rate (step: updates so far)."""

    def dims(path, shape):
        return factored_dims(_rule(factor_map, path), shape, factored, min_dim_size_to_factor)[1]

    def init_fn(params):
        def one(p, x):
            d = dims(path_str(p), tuple(x.shape))
            if d is None:
                return jnp.zeros((1,), jnp.float32), jnp.zeros((1,), jnp.float32), jnp.zeros(x.shape, jnp.float32)
            rows, cols = d
            return (
                jnp.zeros(_delete(x.shape, cols), jnp.float32),
                jnp.zeros(_delete(x.shape, rows), jnp.float32),
                jnp.zeros((1,), jnp.float32),
            )

        v_row, v_col, v = _unzip(jax.tree_util.tree_map_with_path(one, params), 3)
        return optax.FactoredState(count=jnp.zeros([], jnp.int32), v_row=v_row, v_col=v_col, v=v)

    def update_fn(grads, state, params=None):
        del params
        t = jnp.asarray(state.count - step_offset, jnp.float32) + 1.0
        beta2 = 1.0 - t ** (-decay_rate)

        def one(p, grad, v_row, v_col, v):
            grad = grad.astype(jnp.float32)
            grad_sqr = grad * grad + epsilon1
            d = dims(path_str(p), tuple(grad.shape))
            if d is None:
                new_v = beta2 * v + (1.0 - beta2) * grad_sqr
                return (grad * jax.lax.rsqrt(new_v), v_row, v_col, new_v)
            rows, cols = d
            new_v_row = beta2 * v_row + (1.0 - beta2) * jnp.mean(grad_sqr, axis=cols)
            new_v_col = beta2 * v_col + (1.0 - beta2) * jnp.mean(grad_sqr, axis=rows)
            reduced_rows = tuple(r - sum(c < r for c in cols) for r in rows)
            row_col_mean = jnp.mean(new_v_row, axis=reduced_rows, keepdims=True)
            row_factor = jax.lax.rsqrt(new_v_row / row_col_mean)
            col_factor = jax.lax.rsqrt(new_v_col)
            y = grad * jnp.expand_dims(row_factor, cols) * jnp.expand_dims(col_factor, rows)
            return (y, new_v_row, new_v_col, v)

        parts = _unzip(jax.tree_util.tree_map_with_path(one, grads, state.v_row, state.v_col, state.v), 4)
        new = optax.FactoredState(count=optax.safe_increment(state.count), v_row=parts[1], v_col=parts[2], v=parts[3])
        return parts[0], new

    return optax.GradientTransformation(init_fn, update_fn)


def _unzip(tree: Any, n: int) -> list[Any]:
    """n trees from a tree of n-tuples (optax's `MaskedNode`s, namedtuples, stay nodes)."""
    return [jax.tree.map(lambda t, i=i: t[i], tree, is_leaf=lambda x: type(x) is tuple) for i in range(n)]


def _averaging(factor_map: FactorMap, path: str, ndim: int) -> tuple[int, ...]:
    rule = _rule(factor_map, path)
    return tuple(i for i in range(ndim) if rule[i] != BATCH)


def clip_by_rms_axes(factor_map: FactorMap, threshold: float) -> optax.GradientTransformation:
    """Divides each update by max(1, RMS / threshold), the RMS over its non-batch dimensions
    (per layer of a scanned parameter, per head)."""

    def update_fn(updates, state, params=None):
        del params

        def one(p, u):
            axes = _averaging(factor_map, path_str(p), u.ndim)
            rms = jnp.sqrt(jnp.mean(u * u, axis=axes, keepdims=True))
            return u / jnp.maximum(1.0, rms / threshold)

        return jax.tree_util.tree_map_with_path(one, updates), state

    return optax.GradientTransformation(lambda _: optax.EmptyState(), update_fn)


def scale_by_param_rms_axes(factor_map: FactorMap, epsilon2: float = 1e-3) -> optax.GradientTransformation:
    """Multiplies each update by max(RMS of the param over its non-batch dimensions, epsilon2)."""

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("scale_by_param_rms_axes needs params")

        def one(p, u, param):
            axes = _averaging(factor_map, path_str(p), u.ndim)
            param = param.astype(jnp.float32)
            scale = jnp.maximum(jnp.sqrt(jnp.mean(param * param, axis=axes, keepdims=True)), epsilon2)
            return u * scale

        return jax.tree_util.tree_map_with_path(one, updates, params), state

    return optax.GradientTransformation(lambda _: optax.EmptyState(), update_fn)


def adafactor_axes(
    learning_rate: Any,
    factor_map: FactorMap,
    *,
    factored: bool = True,
    min_dim_size_to_factor: int = 128,
    decay_rate: float = 0.8,
    step_offset: int = 0,
    multiply_by_parameter_scale: bool = True,
    clipping_threshold: float | None = 1.0,
    momentum: float | None = None,
    weight_decay_rate: float | None = None,
    weight_decay_mask: Any = None,
    epsilon1: float = 1e-30,
    epsilon2: float = 1e-3,
) -> optax.GradientTransformation:
    """t5x's Adafactor update with factoring by `factor_map` (`logical_factor_map`): the update
    is -(lr * max(param RMS, epsilon2) * clip(g / sqrt(v)) [momentum-averaged] + wd * param),
    weight decay not scaled by the learning rate (t5x), masked by `weight_decay_mask`."""
    tx = [scale_by_factored_rms_axes(factor_map, factored, decay_rate, step_offset, min_dim_size_to_factor, epsilon1)]
    if clipping_threshold is not None:
        tx.append(clip_by_rms_axes(factor_map, clipping_threshold))
    tx.append(optax.scale_by_learning_rate(learning_rate, flip_sign=False))
    if multiply_by_parameter_scale:
        tx.append(scale_by_param_rms_axes(factor_map, epsilon2))
    if momentum is not None:
        tx.append(optax.ema(momentum, debias=False))
    if weight_decay_rate:
        tx.append(optax.add_decayed_weights(weight_decay_rate, mask=weight_decay_mask))
    tx.append(optax.scale(-1))
    return optax.chain(*tx)
