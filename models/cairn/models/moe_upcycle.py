"""Sparse upcycling (Komatsuzaki et al. 2022, t5x's `moe` upcycling): a mixture-of-experts
model started from a dense checkpoint.

`upcycle(dense_params, dense_config, moe, rng)` returns the parameters of the model that
`dense_config` with `moe` describes: in every routed layer each expert is a copy of that
layer's dense MLP (dense `mlp/wi_0` (T5) or `mlp/wi_0/kernel` (Llama) -> `mlp/wi_0/kernel`
`[experts, ...]`; a scanned stack's `[layers, experts, ...]`), the router is fresh (drawn from
`rng` as the MoE model's own init draws it), and every other parameter is the dense one.

At step 0 the upcycled model computes the dense model's function wherever no token is
dropped and each token's routing weights sum to 1 (token choice with `renormalize`, dropless
or with capacity to spare): the routed MLP returns `sum_k w_k * mlp(x) = mlp(x)`. A token
dropped from all its experts gets a zero MLP output (it skips the MLP through the residual),
and one dropped from some gets `sum of its kept weights * mlp(x)`, so its logits differ.
"""

from __future__ import annotations

from typing import Any

import flax.traverse_util as traverse_util
import jax
import jax.numpy as jnp

from cairn.models.moe_config import MoeConfig
from cairn.models.transformer_config import ModelConfig

Path = tuple[str, ...]
ROUTER = ("router", "kernel")


class UpcycleError(ValueError):
    """The dense parameters cannot seed the MoE model; the message names the tensor."""


def moe_model_config(dense_config: ModelConfig, moe: MoeConfig | ModelConfig) -> ModelConfig:
    """The MoE model's config: `dense_config` with `moe` (a `MoeConfig`), or `moe` itself
    (a model config of the same family with its `moe` set)."""
    if getattr(dense_config, "moe", None) is not None:
        name = type(dense_config).__name__
        raise UpcycleError(f"dense_config ({name}) has moe set: upcycling starts from a dense model")
    if isinstance(moe, MoeConfig):
        return dense_config.replace(moe=moe)
    if not isinstance(moe, ModelConfig) or getattr(moe, "moe", None) is None:
        raise UpcycleError(f"expected a MoeConfig or a model config with moe set, got {type(moe).__name__}")
    if type(moe) is not type(dense_config):
        raise UpcycleError(f"the MoE config is a {type(moe).__name__}, the dense one a {type(dense_config).__name__}")
    return moe


def _model(config: ModelConfig) -> Any:
    from cairn.models.families import family_of

    return family_of(config).make_model(config)


def _name(path: Path) -> str:
    return "/".join(path)


def _router_paths(flat: dict[Path, Any]) -> list[Path]:
    return [p for p in flat if p[-2:] == ROUTER and len(p) > 2 and p[-3] == "mlp"]


def upcycle(
    dense_params: Any, dense_config: ModelConfig, moe: MoeConfig | ModelConfig, rng: jax.Array
) -> dict[str, Any]:
    """MoE parameters built from a dense model's (see the module docstring).

    `moe`: a `MoeConfig` (the MoE model is `dense_config.replace(moe=moe)`) or the MoE model's
    config. `UpcycleError` (a ValueError) naming the tensor when a dense parameter is missing,
    left over, or of a shape the MoE model cannot take (a different `emb_dim`, an
    `expert_mlp_dim` other than the dense `mlp_dim`, ...).
    """
    config = moe_model_config(dense_config, moe)
    model = _model(config)
    target = traverse_util.flatten_dict(jax.eval_shape(model.init, rng))
    dense = traverse_util.flatten_dict(dict(dense_params))
    routers = _router_paths(target)
    routed_mlps = {p[:-2] for p in routers}
    out: dict[Path, Any] = {}
    used: set[Path] = set()
    for path, want in target.items():
        if path[:-2] not in routed_mlps:
            out[path] = _copy(dense, path, want, used)
        elif path[-2:] != ROUTER:  # a routed MLP's `<name>/kernel`
            out[path] = _experts(dense, path, want, used)
    left = sorted(_name(p) for p in set(dense) - used)
    if left:
        raise UpcycleError(f"{left[0]}: a dense param the MoE model has no place for ({len(left)} such)")
    # The routers as the MoE model's init draws them (the rest of its init is never computed).
    out.update(jax.jit(lambda key: {p: traverse_util.flatten_dict(model.init(key))[p] for p in routers})(rng))
    return traverse_util.unflatten_dict(out)


def _copy(dense: dict[Path, Any], path: Path, want: jax.ShapeDtypeStruct, used: set[Path]) -> jnp.ndarray:
    """A parameter the dense and MoE models share."""
    if path not in dense:
        raise UpcycleError(f"{_name(path)}: missing from the dense params (the MoE model needs {want.shape})")
    have = tuple(jnp.shape(dense[path]))
    if have != want.shape:
        raise UpcycleError(f"{_name(path)}: the dense param has shape {have}, the MoE model needs {want.shape}")
    used.add(path)
    return jnp.asarray(dense[path], want.dtype)


def _experts(dense: dict[Path, Any], path: Path, want: jax.ShapeDtypeStruct, used: set[Path]) -> jnp.ndarray:
    """Expert kernel `path` `[(layers,) experts, ...]` as copies of the dense MLP's kernel."""
    sources = (path, path[:-1])  # Llama's `mlp/wi_0/kernel`, T5's `mlp/wi_0`
    source = next((p for p in sources if p in dense), None)
    axis = 1 if "layers" in path else 0  # a scanned stack's kernels lead with the layers axis
    each = want.shape[:axis] + want.shape[axis + 1 :]
    if source is None:
        raise UpcycleError(f"{_name(path[:-1])}: missing from the dense params (each expert needs its {each} kernel)")
    value = dense[source]
    if tuple(jnp.shape(value)) != each:
        raise UpcycleError(
            f"{_name(source)}: the dense kernel has shape {tuple(jnp.shape(value))}, each expert of "
            f"{_name(path)} {want.shape} needs {each} (experts start as copies of it: "
            "moe.expert_mlp_dim must be the dense mlp_dim)"
        )
    used.add(source)
    return jnp.broadcast_to(jnp.expand_dims(jnp.asarray(value, want.dtype), axis), want.shape)
