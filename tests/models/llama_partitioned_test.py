"""The Llama model under cairn.partitioning's Partitioner on 8 devices equals one device: an
AdamW train step with data x model sharding (2 x 4) and with FSDP (data 2 x fsdp 2 x model 2),
the loss's gradients with key/value heads that do and do not divide the model axis, greedy
decoding with the cache, and the shardings cuDNN's attention refuses. Key/value heads (the
`heads` logical axis) shard over `model`."""

import functools

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from cairn.models import DecodeOptions, DecoderOnlyModel, LlamaConfig, gpu_attention
from cairn.models.llama import attention as llama_attention
from cairn.models.llama.attention import GROUPED_KV_ACT, HEAD_ACT, key_value_axes
from cairn.partitioning import Partitioner, create_mesh, platform, standard_logical_axis_rules

CONFIG = LlamaConfig(
    vocab_size=64, emb_dim=32, num_heads=8, num_kv_heads=4, head_dim=8, mlp_dim=64, num_layers=2, scan_layers=True
)


@pytest.fixture(scope="module")
def setup(tiny):
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    model = DecoderOnlyModel(CONFIG, z_loss=1e-4)
    params = tiny.random_params(model, std=CONFIG.init_std)
    tokens = tiny.random_tokens(1, (4, 12), 64)
    batch = {
        "decoder_target_tokens": tokens,
        "decoder_input_tokens": np.pad(tokens[:, :-1], ((0, 0), (1, 0))),
        "decoder_segment_ids": np.array([[1] * 6 + [2] * 6] * 4, np.int32),
        "decoder_positions": np.array([list(range(6)) * 2] * 4, np.int32),
    }
    return model, params, batch


def _train_step(model, optimizer):
    def step(params, opt_state, batch):
        (loss, _), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


OPTIMIZER = optax.adamw(1e-2, weight_decay=0.1)


@pytest.fixture(scope="module")
def one_device(setup):
    """The optimizer's initial state and the one-device step's (params, opt_state, loss),
    compiled once for both meshes."""
    model, params, batch = setup
    opt_state = jax.jit(OPTIMIZER.init)(params)
    return opt_state, jax.jit(_train_step(model, OPTIMIZER))(params, opt_state, batch)


@pytest.mark.parametrize(
    "mesh,fsdp", [({"data": 2, "fsdp": 1, "model": 4}, False), ({"data": 2, "fsdp": 2, "model": 2}, True)]
)
def test_a_sharded_train_step_matches_one_device(setup, one_device, mesh, fsdp):
    model, params, batch = setup
    step = _train_step(model, OPTIMIZER)
    opt_state, (want_params, _, want_loss) = one_device

    rules = standard_logical_axis_rules(fsdp=fsdp)
    partitioner = Partitioner(create_mesh(mesh), rules, on_indivisible="error")
    specs = model.logical_axes()
    shardings = partitioner.shardings_for(specs, params)
    opt_shardings = partitioner.opt_state_shardings(params, specs, opt_state)
    sharded = partitioner.partition(
        step, in_shardings=(shardings, opt_shardings, None), out_shardings=(shardings, opt_shardings, None)
    )
    with nn.logical_axis_rules(rules):
        got_params, _, loss = sharded(
            jax.device_put(params, shardings),
            jax.device_put(opt_state, opt_shardings),
            partitioner.shard_batch(batch),
        )
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), got_params, want_params)
    attention = got_params["layers"]["attention"]
    model_axis = "model"
    embed_axis = "fsdp" if fsdp else None
    assert attention["query"]["kernel"].sharding.spec == P(None, embed_axis, model_axis, None)
    assert attention["key"]["kernel"].sharding.spec == P(None, embed_axis, model_axis, None)  # kv heads too
    assert got_params["layers"]["mlp"]["wi_0"]["kernel"].sharding.spec == P(None, embed_axis, model_axis)


@pytest.mark.filterwarnings("ignore::cairn.partitioning.rules.IndivisibleDimensionWarning")  # 2 key/value heads
@pytest.mark.parametrize("kv_heads", [2, 4])
def test_gradients_match_one_device_whether_or_not_kv_heads_divide_the_model_axis(setup, tiny, kv_heads):
    """The loss's gradients, leaf by leaf, on data 2 x model 4 against one device, with 8 query
    heads over 2 key/value heads (their kernels fall back to `kv`; the keys and values reach
    XLA's attention with their heads whole, `key_value_axes`) and over 4 (sharded like the
    query's). With the keys and values sharded over `head_dim` as well, XLA computed key and
    value gradients off by as much as the gradients themselves (the loss right); float32
    reduction order moves them by under 1e-6 of each leaf's largest value."""
    _, _, batch = setup
    config = CONFIG.replace(num_kv_heads=kv_heads, num_layers=1, scan_layers=False)
    model = DecoderOnlyModel(config)
    params = tiny.random_params(model, std=0.2)
    grad_fn = jax.value_and_grad(lambda p, b: model.loss_fn(p, b)[0])
    want_loss, want = jax.jit(grad_fn)(params, batch)
    rules = standard_logical_axis_rules()
    partitioner = Partitioner(create_mesh({"data": 2, "fsdp": 1, "model": 4}), rules)
    shardings = partitioner.shardings_for(model.logical_axes(), params)
    sharded = partitioner.partition(grad_fn, in_shardings=(shardings, None), out_shardings=(None, shardings))
    loss, got = sharded(jax.device_put(params, shardings), partitioner.shard_batch(batch))
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves(want)):
        g, w = np.asarray(g), np.asarray(w)
        error = float(np.max(np.abs(g - w)))
        assert error <= 1e-4 * float(np.max(np.abs(w))), f"{jax.tree_util.keystr(path)}: off by {error}"
    key_spec = got["layers_0"]["attention"]["key"]["kernel"].sharding.spec
    assert key_spec == (P(None, "model", None) if kv_heads == 4 else P(None, None, "model"))


def test_key_value_axes_keep_kv_heads_whole_only_where_the_query_heads_take_the_axis():
    """`key_value_axes`: `HEAD_ACT` without a partitioner, when the key/value heads take the
    query heads' mesh axis, and when neither does (both fall back to `head_dim`);
    `GROUPED_KV_ACT` when only the query's heads take it."""
    q8, q6 = (4, 12, 8, 8), (4, 12, 6, 8)
    assert key_value_axes(q8, (4, 12, 2, 8)) == HEAD_ACT
    partitioner = Partitioner(create_mesh({"data": 2, "fsdp": 1, "model": 4}), standard_logical_axis_rules())
    with partitioner.activated():
        assert key_value_axes(q8, (4, 12, 4, 8)) == HEAD_ACT
        assert key_value_axes(q8, (4, 12, 2, 8)) == GROUPED_KV_ACT
        assert key_value_axes(q8, (4, 12, 1, 8)) == GROUPED_KV_ACT
        assert key_value_axes(q6, (4, 12, 2, 8)) == HEAD_ACT


def test_cudnn_refuses_shardings_its_own_partitioning_cannot_take():
    """`gpu_attention.unsupported_reason` compiling for a GPU under a data 2 x model 4 mesh:
    key/value heads that take the query heads' axis are fine (cuDNN's call partitions itself
    over batch and heads); 2 key/value heads fall back to sharding `head_dim`, which it refuses."""
    bf16 = "bfloat16"
    partitioner = Partitioner(create_mesh({"data": 2, "fsdp": 1, "model": 4}), standard_logical_axis_rules())
    q = (4, 12, 8, 8)
    with platform.compile_target("gpu"):
        assert gpu_attention.unsupported_reason(q, (4, 12, 2, 8), bf16) is None  # no mesh
        with partitioner.activated():
            assert gpu_attention.unsupported_reason(q, (4, 12, 4, 8), bf16) is None
            assert "head_dim" in gpu_attention.unsupported_reason(q, (4, 12, 2, 8), bf16)


@pytest.mark.parametrize("flat", [False, True])
def test_greedy_decoding_matches_one_device(setup, flat, monkeypatch):
    """Also with TPU's flat decode cache (`llama.attention.flat_cache`, forced on the CPU)."""
    if flat:
        monkeypatch.setattr(llama_attention, "FLAT_CACHE_PLATFORMS", ("cpu",))
    model, params, batch = setup
    rules = standard_logical_axis_rules()
    partitioner = Partitioner(create_mesh({"data": 2, "fsdp": 1, "model": 4}), rules, on_indivisible="error")
    shardings = partitioner.shardings_for(model.logical_axes(), params)
    predict = functools.partial(model.predict_batch, options=DecodeOptions(max_decode_length=8))
    prompts = batch["decoder_target_tokens"][:, :3]
    want, _ = jax.jit(predict)(params, prompts)
    with nn.logical_axis_rules(rules):
        got, _ = partitioner.partition(predict, in_shardings=(shardings, None))(
            jax.device_put(params, shardings), partitioner.shard_batch(prompts)
        )
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
