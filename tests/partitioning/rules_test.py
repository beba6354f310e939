import warnings

import pytest
from jax.sharding import PartitionSpec as P

from cairn.partitioning import (
    IndivisibleDimensionError,
    IndivisibleDimensionWarning,
    UnknownLogicalAxisError,
    logical_to_mesh_spec,
    standard_logical_axis_rules,
)

MESH = {"data": 2, "fsdp": 2, "model": 2}


def resolve(spec, shape=None, mesh=MESH, on_indivisible="replicate", **mode):
    return logical_to_mesh_spec(
        spec, standard_logical_axis_rules(**mode), mesh, shape, "encoder/layers_0/mlp/wi/kernel", on_indivisible
    )


def test_t5x_standard_rules_1d():
    assert resolve(("batch", "length", "embed")) == P("data", None, None)
    assert resolve(("embed", "mlp")) == P(None, "model")
    assert resolve(("vocab", "embed")) == P("model", None)
    assert resolve(("embed", "heads", "kv")) == P(None, "model", None)  # heads wins, kv stays whole
    assert resolve(("embed", "joined_kv")) == P(None, "model")
    assert resolve(("layers", "embed", "mlp")) == P(None, None, "model")
    assert resolve(("relpos_buckets", "heads")) == P(None, "model")


def test_2d_activation_and_parameter_modes():
    # Activations: embed also over model; a param still gives 'model' to mlp (rule order).
    assert resolve(("batch", "length", "embed"), activation_partitioning_dims=2) == P("data", None, "model")
    assert resolve(("embed", "mlp"), activation_partitioning_dims=2) == P(None, "model")
    # Parameters 2-D (t5x): embed over data.
    assert resolve(("embed", "mlp"), parameter_partitioning_dims=2) == P("data", "model")
    assert resolve(("embed", "mlp"), activation_partitioning_dims=2, parameter_partitioning_dims=2) == P(
        "data", "model"
    )
    assert resolve(("vocab", "embed"), activation_partitioning_dims=2, parameter_partitioning_dims=2) == P(
        "model", "data"
    )


def test_fsdp_mode():
    assert resolve(("batch", "length", "embed"), fsdp=True) == P(("data", "fsdp"), None, None)
    assert resolve(("embed", "mlp"), fsdp=True) == P("fsdp", "model")
    assert resolve(("vocab", "embed"), fsdp=True) == P("model", "fsdp")
    assert resolve(("embed",), fsdp=True) == P("fsdp")


def test_invalid_modes():
    with pytest.raises(ValueError, match="must be 1 or 2"):
        standard_logical_axis_rules(activation_partitioning_dims=3)


def test_unknown_logical_axis_names_path_and_axis():
    with pytest.raises(UnknownLogicalAxisError, match=r"encoder/layers_0/mlp/wi/kernel.*'hidden'"):
        resolve(("embed", "hidden"))


def test_rule_to_missing_mesh_axis_is_an_error():
    with pytest.raises(ValueError, match=r"mesh axes \['fsdp'\]"):
        resolve(("embed", "mlp"), mesh={"data": 4, "model": 2}, fsdp=True)


def test_spec_longer_than_shape_is_an_error_and_shorter_is_padded():
    with pytest.raises(ValueError, match="3 entries but the array has shape"):
        resolve(("embed", "mlp", "vocab"), shape=(4, 4))
    assert resolve(("batch",), shape=(4, 6)) == P("data", None)


def test_indivisible_dimension_replicates_with_warning_naming_the_parameter():
    mesh = {"data": 1, "model": 8}
    with pytest.warns(IndivisibleDimensionWarning, match=r"encoder/layers_0/mlp/wi/kernel.*size 6"):
        # 6 heads cannot split 8 ways: heads is replicated and kv takes 'model' instead.
        assert resolve(("embed", "heads", "kv"), shape=(512, 6, 64), mesh=mesh) == P(None, None, "model")
    with pytest.warns(IndivisibleDimensionWarning):
        assert resolve(("embed", "mlp"), shape=(512, 12), mesh=mesh) == P(None, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # divisible: no warning
        assert resolve(("embed", "mlp"), shape=(512, 16), mesh=mesh) == P(None, "model")


def test_indivisible_dimension_error_policy():
    with pytest.raises(IndivisibleDimensionError, match=r"wi/kernel.*dimension 1 \('mlp', size 12\).*size 8"):
        resolve(("embed", "mlp"), shape=(512, 12), mesh={"data": 1, "model": 8}, on_indivisible="error")
    with pytest.raises(ValueError, match="on_indivisible"):
        resolve(("embed",), on_indivisible="pad")


EXPERT_MESH = {"data": 2, "fsdp": 1, "expert": 4, "model": 1}


def test_expert_axis_shards_experts_and_spreads_the_batch():
    # Expert kernels [expert, embed, mlp] and the dispatched activations [expert, batch, capacity, embed].
    assert resolve(("expert", "embed", "mlp"), mesh=EXPERT_MESH) == P("expert", None, "model")
    assert resolve(("layers", "expert", "mlp", "embed"), mesh=EXPERT_MESH) == P(None, "expert", "model", None)
    assert resolve(("expert", "batch", None, "embed"), mesh=EXPERT_MESH) == P("expert", "data", None, None)
    # Without an expert dimension the batch takes the expert axis too (GShard).
    assert resolve(("batch", "length", "embed"), mesh=EXPERT_MESH) == P(("data", "expert"), None, None)
    mesh = {"data": 2, "fsdp": 2, "expert": 2, "model": 1}
    assert resolve(("batch", "length"), mesh=mesh, fsdp=True) == P(("data", "fsdp", "expert"), None)
    assert resolve(("expert", "batch", None, "embed"), mesh=mesh, fsdp=True) == P(
        "expert", ("data", "fsdp"), None, None
    )
    assert resolve(("expert", "embed", "mlp"), mesh=mesh, fsdp=True) == P("expert", "fsdp", "model")


def test_a_batch_the_expert_axis_does_not_divide_falls_back_to_data():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fallback rule fits: no warning
        assert resolve(("batch", "length"), shape=(6, 4), mesh=EXPERT_MESH) == P("data", None)
    with pytest.warns(IndivisibleDimensionWarning, match="size 6"):
        assert resolve(("expert", "mlp"), shape=(6, 4), mesh=EXPERT_MESH) == P(None, "model")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve(("expert", "mlp"), shape=(6, 4), mesh=EXPERT_MESH, on_indivisible="quiet") == P(None, "model")


def test_a_mesh_without_an_expert_axis_counts_it_as_size_one():
    from cairn.partitioning import OPTIONAL_AXES, rules_for_mesh

    assert OPTIONAL_AXES == ("expert",)
    assert resolve(("expert", "embed", "mlp")) == P(None, None, "model")
    assert resolve(("batch", "length", "embed"), mesh={"data": 4, "model": 2}) == P("data", None, None)
    assert resolve(("batch", "length"), mesh=MESH, fsdp=True) == P(("data", "fsdp"), None)
    flax_rules = dict(rules_for_mesh(standard_logical_axis_rules(), {"data": 4, "model": 2}))
    assert flax_rules["expert"] is None and "expert" not in str(flax_rules.values())
    with_axis = rules_for_mesh(standard_logical_axis_rules(), EXPERT_MESH)
    assert with_axis[:2] == [("expert", "expert"), ("batch", ("data", "expert"))]
    # Only optional axes are dropped: a rule naming another missing axis still fails.
    with pytest.raises(ValueError, match=r"mesh axes \['fsdp'\]"):
        resolve(("batch",), mesh={"data": 4, "model": 2}, fsdp=True)
