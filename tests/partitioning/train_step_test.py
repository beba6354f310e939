"""A small Flax model's train step (Adafactor) on the issue's meshes equals one device; the
optimizer-state shardings of factored, scanned, square and indivisible statistics."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from cairn.partitioning import (
    IndivisibleDimensionError,
    Partitioner,
    create_mesh,
    opt_state_logical_specs,
    standard_logical_axis_rules,
)

VOCAB, EMBED, MLP, BATCH, LENGTH = 64, 16, 32, 8, 4


# -- a small Flax model's train step ---------------------------------------------------------


class TinyLM(nn.Module):
    constrain: object = staticmethod(lambda x, spec: x)

    @nn.compact
    def __call__(self, tokens):
        init = nn.initializers.normal(0.5)
        emb = self.param("embedding", nn.with_logical_partitioning(init, ("vocab", "embed")), (VOCAB, EMBED))
        x = self.constrain(jnp.take(emb, tokens, axis=0), ("batch", "length", "embed"))
        h = nn.Dense(MLP, use_bias=False, kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")), name="wi")(
            x
        )
        h = self.constrain(nn.gelu(h), ("batch", "length", "mlp"))
        x = x + nn.Dense(
            EMBED, use_bias=False, kernel_init=nn.with_logical_partitioning(init, ("mlp", "embed")), name="wo"
        )(h)
        return x @ emb.T


def make_step(model, optimizer):
    def step(params, opt_state, batch):
        def loss_fn(p):
            logits = model.apply({"params": p}, batch["inputs"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


OPTIMIZER = optax.adafactor(1e-2, min_dim_size_to_factor=8)  # factors every 2-D kernel here


@pytest.fixture(scope="module")
def setup():
    tokens = np.random.default_rng(1).integers(0, VOCAB, (BATCH, LENGTH + 1), dtype=np.int32)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
    key = jax.random.PRNGKey(0)
    abstract = jax.eval_shape(TinyLM().init, key, batch["inputs"])
    specs = nn.get_partition_spec(abstract)["params"]
    # Compiled, as the partitioned init below is (op by op, each operation compiles its own program).
    params = nn.meta.unbox(jax.jit(TinyLM().init)(key, batch["inputs"]))["params"]
    opt_state = jax.jit(OPTIMIZER.init)(params)
    step = jax.jit(make_step(TinyLM(), OPTIMIZER))
    p, o = params, opt_state
    for _ in range(2):
        p, o, loss = step(p, o, batch)
    return dict(batch=batch, specs=specs, params=params, opt_state=opt_state, want=(p, o, loss), key=key)


def test_flax_train_step_equals_one_device(partitioner, setup, assert_sharding):
    batch, specs, params, opt_state = setup["batch"], setup["specs"], setup["params"], setup["opt_state"]
    param_sh = partitioner.shardings_for(specs, params)
    opt_sh = partitioner.opt_state_shardings(params, specs, opt_state)
    batch_sh = partitioner.shardings_for({"inputs": ("batch", "length"), "targets": ("batch", "length")}, batch)
    model = TinyLM(constrain=partitioner.with_sharding_constraint)

    # Initialising straight into the shardings gives the same values as on one device.
    init = partitioner.partition(
        lambda k: nn.meta.unbox(model.init(k, batch["inputs"]))["params"], out_shardings=param_sh
    )
    p = init(setup["key"])
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), p, params)
    o = jax.device_put(jax.tree.map(np.array, opt_state), opt_sh)  # copies: the step donates them
    step = partitioner.partition(
        make_step(model, OPTIMIZER),
        in_shardings=(param_sh, opt_sh, batch_sh),
        out_shardings=(param_sh, opt_sh, P()),
        donate_argnums=(0, 1),
    )
    b = partitioner.shard_batch(batch, ("batch", "length"))
    for _ in range(2):
        p, o, loss = step(p, o, b)
    want_p, want_o, want_loss = setup["want"]
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5)
    jax.tree.map(
        lambda a, e: np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=2e-5, atol=2e-6),
        (p, o),
        (want_p, want_o),
    )
    assert_sharding(p["embedding"], partitioner, ("vocab", "embed"))
    assert_sharding(p["wi"]["kernel"], partitioner, ("embed", "mlp"))
    assert_sharding(p["wo"]["kernel"], partitioner, ("mlp", "embed"))
    jax.tree.map(lambda a, s: assert_same(a.sharding, s, a.ndim), o, opt_sh)


def assert_same(actual, want, ndim):
    assert actual.is_equivalent_to(want, ndim), (actual, want)


def test_adafactor_state_shardings(setup):
    """Full-shape statistics follow their param (as optax.tree_map_params says); factored
    rows and columns keep the param's spec minus the factored dimension."""
    partitioner = Partitioner(create_mesh({"data": 2, "fsdp": 2, "model": 2}), standard_logical_axis_rules(fsdp=True))
    params, specs, opt_state = setup["params"], setup["specs"], setup["opt_state"]
    param_sh = partitioner.shardings_for(specs, params)
    replicated = NamedSharding(partitioner.mesh, P())
    reference = optax.tree_utils.tree_map_params(
        OPTIMIZER,
        lambda leaf, p, sh: sh if leaf.shape == p.shape else None,
        opt_state,
        params,
        param_sh,
        transform_non_params=lambda _: replicated,
    )
    ours = partitioner.opt_state_shardings(params, specs, opt_state)
    factored = opt_state[0]  # FactoredState(count, v_row, v_col, v)
    assert factored.v_row["wi"]["kernel"].shape == (EMBED,)
    assert factored.v_col["wi"]["kernel"].shape == (MLP,)
    assert ours[0].v_row["wi"]["kernel"].spec == P("fsdp")
    assert ours[0].v_col["wi"]["kernel"].spec == P("model")
    assert ours[0].v_row["embedding"].spec == P("fsdp")  # (vocab, embed) minus the larger vocab
    assert ours[0].v_col["embedding"].spec == P("model")
    n_checked = 0
    for mine, ref in zip(jax.tree.leaves(ours), jax.tree.leaves(reference, is_leaf=lambda x: x is None)):
        if ref is not None:
            assert mine == ref
            n_checked += 1
    assert n_checked >= 1
    # Without a param tree to match, a leaf is replicated.
    logical = opt_state_logical_specs(params, specs, {"count": jnp.zeros(()), "other": jnp.zeros((3, 5))})
    assert logical == {"count": P(), "other": P()}


def test_factored_specs_of_scanned_square_and_short_specs():
    """Real optax Adafactor shapes: a scanned [layers, embed, mlp] kernel keeps `layers`; a
    square kernel is ambiguous (replicated); a spec shorter than its array is padded."""
    params = {"stack": jnp.zeros((2, 128, 256)), "square": jnp.zeros((128, 128)), "short": jnp.zeros((256, 128))}
    specs = {"stack": ("layers", "embed", "mlp"), "square": ("embed", "mlp"), "short": ("vocab",)}
    state = jax.eval_shape(optax.adafactor(1e-2).init, params)  # the specs depend on the shapes only
    logical = opt_state_logical_specs(params, specs, state)[0]
    assert state[0].v_row["stack"].shape == (2, 128) and state[0].v_col["stack"].shape == (2, 256)
    assert logical.v_row["stack"] == P("layers", "embed") and logical.v_col["stack"] == P("layers", "mlp")
    assert logical.v_row["square"] == P() and logical.v_col["square"] == P()
    assert logical.v_row["short"] == P(None) and logical.v_col["short"] == P("vocab")
    assert logical.v["stack"] == P() and logical.count == P()


def test_opt_state_shardings_replicate_quietly_even_with_on_indivisible_error():
    """mlp (256) takes 'model' in the kernel, so its kv dim (132) never asks for it; Adafactor's
    v_row drops mlp and keeps kv, which 'model' (8) does not divide: replicated, no warning,
    no error (the param itself was checked)."""
    params = {"w": jnp.zeros((256, 132))}
    specs = {"w": ("mlp", "kv")}
    state = jax.eval_shape(optax.adafactor(1e-2).init, params)  # the shardings depend on the shapes only
    for mode in ("replicate", "error"):
        partitioner = Partitioner(
            create_mesh({"data": 1, "model": 8}), standard_logical_axis_rules(), on_indivisible=mode
        )
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert partitioner.shardings_for(specs, params)["w"].spec == P("model", None)
            sh = partitioner.opt_state_shardings(params, specs, state)
        assert sh[0].v_row["w"].spec == P(None) and sh[0].v_col["w"].spec == P("model")
        assert sh[0].v["w"].spec == P(None)  # (1,): unfactored slot of a factored param
    with pytest.raises(IndivisibleDimensionError, match="'kv', size 132"):
        partitioner.shardings_for({"v_row": ("kv",)}, {"v_row": jnp.zeros((132,))})


def test_masked_states_of_multi_transform_follow_their_params():
    """optax.multi_transform puts a MaskedNode at each param another group handles: the rest of
    the subtree is still shaped like the params, so its moments follow their params' specs."""
    params = {"wi": jnp.zeros((4, 8)), "frozen": jnp.zeros((8, 4))}
    specs = {"wi": ("embed", "mlp"), "frozen": ("mlp", "embed")}
    tx = optax.multi_transform({"a": optax.adam(1e-3), "z": optax.set_to_zero()}, {"wi": "a", "frozen": "z"})
    state = jax.eval_shape(tx.init, params)  # the specs depend on the shapes only
    logical = opt_state_logical_specs(params, specs, state)
    adam = logical.inner_states["a"].inner_state[0]
    assert adam.mu["wi"] == P("embed", "mlp") and adam.nu["wi"] == P("embed", "mlp")
    assert jax.tree.structure(adam.mu) == jax.tree.structure(state.inner_states["a"].inner_state[0].mu)
