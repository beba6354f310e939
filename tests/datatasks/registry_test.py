"""Feature, Task, Mixture and the registries."""

import dataclasses

import pytest
import tensorflow as tf
from data_util import ids_dataset, ids_vocab

import cairn.datatasks as dt


def make_task(name, n=4, value=5):
    src = dt.FunctionDataSource(
        lambda split, shuffle_files: ids_dataset([{"targets": [value, 1]}] * n),
        ["train"],
        num_input_examples={"train": n},
    )
    return dt.Task(name, src, {"targets": dt.Feature(ids_vocab())})


def test_feature_defaults_and_frozen():
    f = dt.Feature(ids_vocab())
    assert (f.add_eos, f.required, f.dtype, f.rank) == (True, True, tf.int32, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.add_eos = False
    with pytest.raises(TypeError, match="Vocabulary"):
        dt.Feature("not a vocabulary")


def test_duplicate_name_is_an_error(registry):
    registry.add_task(make_task("wiki_en"))
    with pytest.raises(dt.DataTasksError, match="'wiki_en'.*already registered"):
        registry.add_task(make_task("wiki_en"))
    with pytest.raises(dt.DataTasksError, match="already registered"):
        registry.add_mixture(dt.Mixture("wiki_en", ["wiki_en"], 1.0, registry=registry))


def test_unknown_name_lists_closest(registry):
    for n in ("wiki_en", "wiki_de", "c4_en", "squad"):
        registry.add_task(make_task(n))
    with pytest.raises(dt.UnknownNameError) as e:
        registry.get("wiki_fr")
    assert "wiki_fr" in str(e.value) and "'wiki_en'" in str(e.value)
    assert "'squad'" not in str(e.value).split("closest registered:")[1][:20]
    with pytest.raises(KeyError):
        registry.get_mixture("wiki_en")


def test_default_registry_facades():
    task = make_task("registry_test_task")
    dt.TaskRegistry.add_provider(task)
    try:
        assert dt.TaskRegistry.get("registry_test_task") is task
        assert "registry_test_task" in dt.TaskRegistry.names()
        mix = dt.MixtureRegistry.add("registry_test_mix", ["registry_test_task"], default_rate=1)
        assert dt.get_mixture_or_task("registry_test_mix") is mix
        dt.MixtureRegistry.remove("registry_test_mix")
    finally:
        dt.TaskRegistry.remove("registry_test_task")
    assert "registry_test_task" not in dt.TaskRegistry.names()


def test_scoped_registries_are_independent(registry):
    other = dt.Registry()
    registry.add_task(make_task("a"))
    other.add_task(make_task("a"))  # the same name in another scope is fine
    assert registry.get("a") is not other.get("a")


def test_mixture_rates_numbers_callables_nested(registry):
    for n, count in (("a", 2), ("b", 6), ("c", 4)):
        registry.add_task(make_task(n, n=count))
    m1 = dt.Mixture("m1", [("a", 1), ("b", 3)], registry=registry)
    assert m1.rates == pytest.approx({"a": 0.25, "b": 0.75})
    by_size = dt.Mixture("by_size", ["a", "b"], default_rate=lambda t: t.num_input_examples("train"), registry=registry)
    assert by_size.rates == pytest.approx({"a": 0.25, "b": 0.75})
    nested = dt.Mixture("nested", [(m1, 2), ("c", 2)], registry=registry)
    assert nested.rates == pytest.approx({"a": 0.125, "b": 0.375, "c": 0.5})
    with pytest.raises(dt.DataTasksError, match="no rate"):
        dt.Mixture("bad", ["a"], registry=registry)
    with pytest.raises(dt.DataTasksError, match="positive sum"):
        dt.Mixture("bad", [("a", 0)], registry=registry)


def test_mixture_samples_at_the_rates(registry):
    # 200 examples a task: a repeated task re-creates its pipeline each epoch, which with 4
    # examples was most of the time.
    registry.add_task(make_task("five", n=200, value=5))
    registry.add_task(make_task("six", n=200, value=6))
    mix = dt.Mixture("m", [("five", 1), ("six", 3)], registry=registry)
    ds = mix.get_dataset({"targets": 4}, seed=1, num_epochs=None).take(2000)
    firsts = [int(x["targets"][0]) for x in ds.as_numpy_iterator()]
    assert 0.70 < firsts.count(6) / len(firsts) < 0.80
    again = [
        int(x["targets"][0])
        for x in mix.get_dataset({"targets": 4}, seed=1, num_epochs=None).take(2000).as_numpy_iterator()
    ]
    assert firsts == again


def test_mixture_refuses_different_vocabularies(registry):
    registry.add_task(make_task("a"))
    src = dt.FunctionDataSource(lambda split, shuffle_files: ids_dataset([{"targets": [2]}]), ["train"])
    registry.add_task(dt.Task("z", src, {"targets": dt.Feature(ids_vocab(50))}))
    with pytest.raises(dt.DataTasksError, match="another vocabulary"):
        dt.Mixture("m", ["a", "z"], 1, registry=registry)


def test_task_arguments_are_checked():
    with pytest.raises(dt.DataTasksError, match="task name"):
        make_task("has space")
    with pytest.raises(dt.DataTasksError, match="must be a DataSource"):
        dt.Task("t", object(), {})
    with pytest.raises(dt.DataTasksError, match="output feature 'x' must be a Feature"):
        dt.Task("t", make_task("u").source, {"x": 3})
