"""Relative position buckets against transformers' T5 implementation."""

import numpy as np
import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from cairn.models.relative_position import RelativePositionBias, relative_position_bucket


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 40)])
def test_buckets_match_transformers(bidirectional, num_buckets, max_distance):
    rel = np.arange(-300, 301, dtype=np.int64)
    ours = np.asarray(relative_position_bucket(rel.astype(np.int32), bidirectional, num_buckets, max_distance))
    theirs = T5Attention._relative_position_bucket(torch.tensor(rel), bidirectional, num_buckets, max_distance).numpy()
    np.testing.assert_array_equal(ours, theirs)
    assert ours.min() >= 0 and ours.max() == num_buckets - 1


def test_causal_maps_future_to_bucket_zero():
    assert np.all(np.asarray(relative_position_bucket(np.arange(1, 50), bidirectional=False)) == 0)


def test_bias_shape_and_axes():
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    module = RelativePositionBias(num_heads=3, num_buckets=8, max_distance=16)
    pos = jnp.arange(5)
    # Shapes and axes only: evaluated abstractly (nothing compiled).
    variables = jax.eval_shape(module.init, jax.random.PRNGKey(0), pos, pos)
    assert jax.eval_shape(module.apply, variables, pos, pos).shape == (1, 3, 5, 5)
    assert nn.get_partition_spec(variables)["params"]["rel_embedding"] == jax.sharding.PartitionSpec(
        "heads", "relpos_buckets"
    )
