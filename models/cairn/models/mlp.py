"""`t5_mlp`: a T5-style layer's MLP, dense or routed.

The routed MLP (`cairn.models.moe.MoeMlp`) is imported only when a layer is sparse, so dense
networks neither load it nor, under Bazel, depend on it: a target that builds a sparse model
depends on `//models:moe` (the umbrella `//models` does).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from cairn.models.layers import MlpBlock


def routed_mlp() -> type[nn.Module]:
    """`cairn.models.moe.MoeMlp`, imported on first use; a clear error when it is not there."""
    try:
        from cairn.models.moe import MoeMlp
    except ModuleNotFoundError as e:
        if e.name != "cairn.models.moe":
            raise
        raise ImportError(
            "a config with routed (MoE) layers needs cairn.models.moe: under Bazel, depend on //models:moe"
        ) from e
    return MoeMlp


def t5_mlp(config: Any, sparse: bool, deterministic: bool, name: str = "mlp") -> nn.Module:
    """A T5-style layer's MLP (`TransformerConfig`: T5 and GPT-style decoders): the dense
    `MlpBlock`, or with `sparse` the routed one (experts initialised as the dense kernels,
    parameters stored as `config.param_dtype`; the router float32)."""
    dt, pdt = jnp.dtype(config.dtype), jnp.dtype(getattr(config, "param_dtype", "float32"))
    if not sparse:
        return MlpBlock(
            config.mlp_dim, config.mlp_activations, config.dropout_rate, dt, deterministic, param_dtype=pdt, name=name
        )
    mlp_dim = config.moe.mlp_dim(config.mlp_dim)
    return routed_mlp()(
        config.moe,
        mlp_dim,
        tuple(config.mlp_activations),
        config.emb_dim**-0.5,
        mlp_dim**-0.5,
        0.02,
        config.dropout_rate,
        dt,
        pdt,
        deterministic,
        name=name,
    )
