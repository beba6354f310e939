"""`count_params`: parameter counts from shapes alone (`jax.eval_shape`, nothing allocated);
`network_for`: the Flax module a config describes."""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from cairn.models.gpt import Decoder, DecoderOnlyConfig
from cairn.models.llama.config import LlamaConfig
from cairn.models.llama.network import Llama
from cairn.models.t5.config import T5Config
from cairn.models.t5.network import EncoderDecoder

# Config class -> network class (the decoder-only networks share `gpt.Decoder`'s signature); a
# family registered from elsewhere (`families.register_family`) adds its own.
NETWORKS: dict[type, type] = {T5Config: EncoderDecoder, DecoderOnlyConfig: Decoder, LlamaConfig: Llama}


def network_for(config: Any) -> nn.Module:
    """The Flax module a config describes."""
    cls = NETWORKS.get(type(config))
    if cls is None:
        known = ", ".join(c.__name__ for c in NETWORKS)
        raise TypeError(f"expected one of {known}, got {type(config).__name__}")
    return cls(config)


def abstract_variables(config: Any, batch: int = 1, length: int = 4) -> Any:
    """The network's variables as `jax.ShapeDtypeStruct`s (boxed with logical axis names)."""
    module = network_for(config)
    tokens = jnp.ones((batch, length), jnp.int32)
    if isinstance(config, T5Config):
        init = lambda key: module.init(key, tokens, tokens)
    else:
        init = lambda key: module.init(key, tokens)
    return jax.eval_shape(init, jax.random.PRNGKey(0))


def count_params(config: Any, active: bool = False) -> int:
    """The number of parameters of the network `config` describes.

    `active=True`: only those one token uses. A routed layer's expert kernels (those with an
    `expert` axis) count for `config.moe.active_experts()` experts (token choice: `top_k`;
    expert choice: `capacity_factor` on average, every expert when `dropless`) instead of all
    `num_experts`; the router and everything dense count in full. The same as the total for a
    dense config."""
    variables = abstract_variables(config)
    params = nn.meta.unbox(variables["params"])
    moe = getattr(config, "moe", None)
    if not active or moe is None:
        return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(params))
    specs = jax.tree_util.tree_leaves(
        nn.get_partition_spec(variables)["params"], is_leaf=lambda x: isinstance(x, PartitionSpec)
    )
    total = 0.0
    for x, spec in zip(jax.tree_util.tree_leaves(params), specs, strict=True):
        n = math.prod(x.shape)
        total += n * moe.active_experts() / moe.num_experts if "expert" in tuple(spec) else n
    return round(total)


def logical_axes(config: Any) -> Any:
    """A tree of `PartitionSpec`s of logical axis names, shaped like the params."""
    return nn.get_partition_spec(abstract_variables(config))["params"]
