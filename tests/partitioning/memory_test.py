"""estimate_memory against the shard sizes JAX itself gives, on T5.1.1 parameter trees."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cairn.partitioning import (
    Partitioner,
    create_mesh,
    estimate_memory,
    standard_logical_axis_rules,
    transformer_activations,
)

# Published T5.1.1 configs (t5x/examples/t5/t5_1_1/{small,xxl}.gin).
T5_1_1 = {
    "small": dict(vocab=32128, emb=512, heads=6, kv=64, mlp=1024, enc=8, dec=8),
    "xxl": dict(vocab=32128, emb=4096, heads=64, kv=64, mlp=10240, enc=24, dec=24),
}


def t5_1_1_params(vocab, emb, heads, kv, mlp, enc, dec, dtype=jnp.float32):
    """(shapes, logical specs) of a T5.1.1 encoder-decoder, named as in t5x's minimal T5."""
    shapes, specs = {}, {}

    def add(path, shape, names):
        shapes[path], specs[path] = jax.ShapeDtypeStruct(shape, dtype), names

    def attention(prefix):
        for name in ("query", "key", "value"):
            add(f"{prefix}/{name}/kernel", (emb, heads, kv), ("embed", "heads", "kv"))
        add(f"{prefix}/out/kernel", (heads, kv, emb), ("heads", "kv", "embed"))

    def mlp_block(prefix):
        add(f"{prefix}/wi_0/kernel", (emb, mlp), ("embed", "mlp"))
        add(f"{prefix}/wi_1/kernel", (emb, mlp), ("embed", "mlp"))
        add(f"{prefix}/wo/kernel", (mlp, emb), ("mlp", "embed"))

    add("token_embedder/embedding", (vocab, emb), ("vocab", "embed"))
    for stack, layers in (("encoder", enc), ("decoder", dec)):
        add(f"{stack}/relpos_bias/rel_embedding", (heads, 32), ("heads", "relpos_buckets"))
        add(f"{stack}/{stack}_norm/scale", (emb,), ("embed",))
        for i in range(layers):
            layer = f"{stack}/layers_{i}"
            attention(f"{layer}/self_attention" if stack == "decoder" else f"{layer}/attention")
            add(f"{layer}/pre_self_attention_layer_norm/scale", (emb,), ("embed",))
            if stack == "decoder":
                attention(f"{layer}/encoder_decoder_attention")
                add(f"{layer}/pre_cross_attention_layer_norm/scale", (emb,), ("embed",))
            mlp_block(f"{layer}/mlp")
            add(f"{layer}/pre_mlp_layer_norm/scale", (emb,), ("embed",))
    add("decoder/logits_dense/kernel", (emb, vocab), ("embed", "vocab"))
    return shapes, specs


def actual_bytes_per_device(tree):
    """Max over devices of the bytes of every shard it holds, from the shardings JAX reports."""
    per_device = {}
    for x in jax.tree.leaves(tree):
        itemsize = np.dtype(x.dtype).itemsize
        for device, index in x.sharding.devices_indices_map(x.shape).items():
            n = 1
            for dim, s in zip(x.shape, index):
                n *= len(range(*s.indices(dim)))
            per_device[device] = per_device.get(device, 0) + n * itemsize
    return max(per_device.values())


def test_t5_1_1_small_matches_the_published_parameter_count():
    shapes, _ = t5_1_1_params(**T5_1_1["small"])
    assert sum(int(np.prod(x.shape)) for x in shapes.values()) == 76_961_152  # HF google/t5-v1_1-small


def test_t5_1_1_xxl_has_about_11_billion_parameters():
    shapes, _ = t5_1_1_params(**T5_1_1["xxl"])
    assert 11.0e9 < sum(int(np.prod(x.shape)) for x in shapes.values()) < 11.2e9  # T5.1.1-xxl: ~11.1B


@pytest.mark.parametrize("size", ["small", "xxl"])
@pytest.mark.parametrize("model_axis", [1, 8])
def test_estimate_agrees_with_shard_sizes(size, model_axis, recwarn):
    """xxl: its layers' shapes, two layers a stack (the estimate is a sum over the leaves, and
    every layer of a stack has the same leaves: 48 layers cost seconds of tracing and say no
    more; the whole model's count is checked above)."""
    config = T5_1_1[size] if size == "small" else dict(T5_1_1[size], enc=2, dec=2)
    shapes, specs = t5_1_1_params(**config)
    mesh = create_mesh({"data": 1, "model": model_axis}, devices=jax.devices()[:model_axis])
    partitioner = Partitioner(mesh, standard_logical_axis_rules())
    optimizer = optax.adafactor(1e-3)
    opt_shapes = jax.eval_shape(optimizer.init, shapes)

    estimate = estimate_memory(shapes, specs, partitioner, opt_state=opt_shapes)

    param_sh = partitioner.shardings_for(specs, shapes)
    opt_sh = partitioner.opt_state_shardings(shapes, specs, opt_shapes)

    def init():  # never run: eval_shape only traces it
        params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        return params, optimizer.init(params)

    params_out, opt_out = jax.eval_shape(jax.jit(init, out_shardings=(param_sh, opt_sh)))
    want_params, want_opt = actual_bytes_per_device(params_out), actual_bytes_per_device(opt_out)
    print(
        f"T5.1.1-{size} mesh (1,{model_axis}): params {estimate.params} vs {want_params}, "
        f"opt_state {estimate.opt_state} vs {want_opt}"
    )
    assert abs(estimate.params - want_params) <= 0.01 * want_params
    assert abs(estimate.opt_state - want_opt) <= 0.01 * want_opt
    total_params = sum(int(np.prod(x.shape)) for x in shapes.values())
    if model_axis == 1:
        assert estimate.params == 4 * total_params
    else:  # most of the model is split 8 ways
        assert estimate.params < 4 * total_params / 6
    if size == "xxl":
        assert model_axis == 1 or not [w for w in recwarn if "not divisible" in str(w.message)]


def test_activations_and_summary():
    mesh = create_mesh({"data": 8, "model": 1})
    partitioner = Partitioner(mesh, standard_logical_axis_rules())
    shapes, specs = t5_1_1_params(**T5_1_1["small"])
    acts = transformer_activations(64, 512, 8, 512, 1024, 6, 64, dtype=jnp.bfloat16)
    est = estimate_memory(shapes, specs, partitioner, activations=acts)
    unsharded = sum(int(np.prod(s.shape)) * 2 for s in acts[0].values())
    assert est.activations == unsharded // 8  # batch split over data=8
    remat = estimate_memory(
        shapes, specs, partitioner, activations=transformer_activations(64, 512, 8, 512, 1024, 6, 64, remat=True)
    )
    assert remat.activations == 8 * 64 * 512 * 512 * 4 // 8
    assert est.total == est.params + est.activations
    assert "GiB/device" in str(est) and "total" in str(est)
