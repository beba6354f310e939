"""`count_params`: parameter counts from shapes alone (`jax.eval_shape`, nothing allocated)."""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from cairn.models.decoder_only import Decoder, DecoderOnlyConfig
from cairn.models.t5.config import T5Config
from cairn.models.t5.network import EncoderDecoder


def network_for(config: T5Config | DecoderOnlyConfig) -> nn.Module:
    """The Flax module a config describes."""
    if isinstance(config, T5Config):
        return EncoderDecoder(config)
    if isinstance(config, DecoderOnlyConfig):
        return Decoder(config)
    raise TypeError(f"expected a T5Config or DecoderOnlyConfig, got {type(config).__name__}")


def abstract_variables(config: T5Config | DecoderOnlyConfig, batch: int = 1, length: int = 4) -> Any:
    """The network's variables as `jax.ShapeDtypeStruct`s (boxed with logical axis names)."""
    module = network_for(config)
    tokens = jnp.ones((batch, length), jnp.int32)
    if isinstance(config, T5Config):
        init = lambda key: module.init(key, tokens, tokens)
    else:
        init = lambda key: module.init(key, tokens)
    return jax.eval_shape(init, jax.random.PRNGKey(0))


def count_params(config: T5Config | DecoderOnlyConfig) -> int:
    """The number of parameters of the network `config` describes."""
    params = nn.meta.unbox(abstract_variables(config)["params"])
    return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(params))


def logical_axes(config: T5Config | DecoderOnlyConfig) -> Any:
    """A tree of `PartitionSpec`s of logical axis names, shaped like the params."""
    return nn.get_partition_spec(abstract_variables(config))["params"]
