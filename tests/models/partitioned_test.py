"""EncoderDecoderModel under cairn.partitioning's Partitioner on 8 devices (data 2 x model 4)
equals one device: the loss, its gradients, and greedy decoding with the cache."""

import functools

import flax.linen as nn
import jax
import numpy as np
import pytest

from cairn.models import DecodeOptions, EncoderDecoderModel
from cairn.partitioning import Partitioner, create_mesh, standard_logical_axis_rules


@pytest.fixture(scope="module")
def setup(tiny):
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    config = tiny.t5_1_1.replace(vocab_size=64, scan_layers=True)
    model = EncoderDecoderModel(config)
    params = tiny.random_params(model, std=0.05)  # numpy-drawn (no init program to compile), about the init's scale
    tgt = tiny.random_tokens(1, (4, 6), 64)
    batch = {
        "encoder_input_tokens": tiny.random_tokens(0, (4, 8), 64),
        "decoder_target_tokens": tgt,
        "decoder_input_tokens": np.pad(tgt[:, :-1], ((0, 0), (1, 0))),
    }
    rules = standard_logical_axis_rules()
    partitioner = Partitioner(create_mesh({"data": 2, "fsdp": 1, "model": 4}), rules, on_indivisible="error")
    param_shardings = partitioner.shardings_for(model.logical_axes(), params)
    return model, params, batch, rules, partitioner, param_shardings


def test_loss_and_grads_match_one_device(setup):
    model, params, batch, rules, partitioner, param_shardings = setup
    grad_fn = jax.value_and_grad(lambda p, b: model.loss_fn(p, b)[0])
    want_loss, want_grads = jax.jit(grad_fn)(params, batch)
    sharded = partitioner.partition(
        grad_fn, in_shardings=(param_shardings, None), out_shardings=(None, param_shardings)
    )
    with nn.logical_axis_rules(rules):
        loss, grads = sharded(jax.device_put(params, param_shardings), partitioner.shard_batch(batch))
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), grads, want_grads)
    query = grads["encoder"]["layers"]["attention"]["query"]
    assert query.sharding.spec == jax.sharding.PartitionSpec(None, None, "model", None)  # heads on 'model'


def test_greedy_decoding_matches_one_device(setup):
    model, params, batch, rules, partitioner, param_shardings = setup
    predict = functools.partial(model.predict_batch, options=DecodeOptions(max_decode_length=6))
    enc = {"encoder_input_tokens": batch["encoder_input_tokens"]}
    want, _ = jax.jit(predict)(params, enc)
    with nn.logical_axis_rules(rules):
        got, _ = partitioner.partition(predict, in_shardings=(param_shardings, None))(
            jax.device_put(params, param_shardings), partitioner.shard_batch(enc)
        )
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
