"""The deterministic reader's NumPy path (records decoded without TensorFlow, post-cache
preprocessors' `numpy_fn`s, seeded ones included, the converters' `convert_numpy`) gives
the batches of the TensorFlow path, and reads a cache in a process that never imports
TensorFlow."""

import json
import os
import subprocess
import sys
import textwrap

import det_run
import det_tasks
import numpy as np
import pytest

import cairn.datatasks as dt
from cairn.datatasks.deterministic import DeterministicReader, cache_task_in_process, record_stage, task_dir
from cairn.datatasks.deterministic.record_stage import FeatureSpec, serialize

LENGTHS = {"inputs": 48, "targets": 16}

# A task module with no TensorFlow at import: the cache is written in this process, the
# reader runs in a fresh one (the same module gives the same fingerprint).
TASKS = """
import cairn.datatasks as dt
from cairn.datatasks import preprocessors as pp
from cairn.datatasks.lazy_tf import tf
from cairn.tokenizers import ByteVocabulary


def halves(ds):
    def fn(line):
        words = tf.strings.split(line)
        half = tf.size(words) // 2
        return {{
            "inputs": tf.strings.reduce_join(words[:half], separator=" "),
            "targets": tf.strings.reduce_join(words[half:], separator=" "),
        }}

    return ds.map(fn)


def register(registry):
    vocab = ByteVocabulary()
    feats = {{"inputs": dt.Feature(vocab), "targets": dt.Feature(vocab)}}
    source = dt.TextLineDataSource({{"train": {data!r}}})
    return registry.add_task(dt.Task("np_task", source, feats, [halves, pp.tokenize, pp.append_eos_after_trim]))
"""

# The seeded post-cache preprocessors of the Shakespeare tasks (span corruption + EOS; a
# random crop), after cached fixed-length chunks, with numpy_fns: no TensorFlow either.
SEEDED_TASKS = """
import functools

import cairn.datatasks as dt
from cairn.datatasks import preprocessors as pp
from cairn.tokenizers import ByteVocabulary


@pp.preprocessor(deterministic=True)
def line_to_targets(ds):
    return ds.map(lambda line: {{"targets": line}})


def register(registry):
    vocab = ByteVocabulary(extra_ids=100)
    cached = [
        line_to_targets,
        pp.tokenize,
        functools.partial(pp.reduce_concat_tokens, feature_key="targets", batch_size=16),
        functools.partial(pp.split_tokens, max_tokens_per_segment=96, feature_key="targets"),
    ]
    source = dt.TextLineDataSource({{"train": {data!r}}})
    feats = {{"inputs": dt.Feature(vocab), "targets": dt.Feature(vocab)}}
    post = [pp.span_corruption_one_to_one, pp.append_eos_after_trim]
    registry.add_task(dt.Task("np_sc", source, feats, cached + post))
    lm_feats = {{"targets": dt.Feature(vocab, add_eos=False)}}
    registry.add_task(dt.Task("np_lm", source, lm_feats, cached + [pp.random_crop]))
"""
SEEDED_LENGTHS = {"np_sc": LENGTHS, "np_lm": {"targets": 32}}

# argv: the tasks module's folder, the cache dir, the module, then JSON
# [[name, task, converter class, pack, sequence_length], ...].
CHILD = textwrap.dedent(
    """
    import hashlib, importlib, json, sys
    sys.path.insert(0, sys.argv[1])
    tasks = importlib.import_module(sys.argv[3])
    import cairn.datatasks as dt
    from cairn.datatasks.deterministic import DeterministicReader

    def digest(batch):  # det_run.digest (the child has only the tasks module on its path)
        h = hashlib.sha256()
        for k in sorted(batch):
            h.update(k.encode())
            h.update(str(batch[k].dtype).encode() + str(batch[k].shape).encode())
            h.update(batch[k].tobytes())
        return h.hexdigest()

    registry = dt.Registry()
    tasks.register(registry)
    out = {}
    for name, task, conv, pack, lengths in json.loads(sys.argv[4]):
        # 2 steps per pass and 2 passes ahead (threads): 6 steps computed, not 3 x 64 or 3 x 256.
        r = DeterministicReader(task, sys.argv[2], seed=3, global_batch_size=4, sequence_length=lengths,
                                feature_converter=getattr(dt, conv)(pack=pack), registry=registry,
                                steps_per_call=2)
        out[name] = [digest(next(r)) for _ in range(6)]
        r.close()
    out["tensorflow_imported"] = "tensorflow" in sys.modules
    print(json.dumps(out))
    """
)


def _child(root, cache_dir, module, runs):
    """Runs CHILD; returns its JSON (the digests of each run, and whether TF was imported)."""
    argv = [sys.executable, "-c", CHILD, root, cache_dir, module, json.dumps(runs)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def np_env(tmp_path_factory, det_env):
    data_dir, _, _ = det_env
    root = tmp_path_factory.mktemp("np")
    (root / "np_tasks.py").write_text(TASKS.format(data=os.path.join(data_dir, "a*.txt")))
    sys.path.insert(0, str(root))
    import np_tasks

    registry = dt.Registry()
    task = np_tasks.register(registry)
    cache_dir = str(root / "cache")
    cache_task_in_process(task, "train", task_dir(cache_dir, "np_task", "train"))
    return str(root), cache_dir, registry


@pytest.fixture(scope="module")
def seeded_env(tmp_path_factory, det_env):
    data_dir, _, _ = det_env
    root = tmp_path_factory.mktemp("np_seeded")
    (root / "seeded_tasks.py").write_text(SEEDED_TASKS.format(data=os.path.join(data_dir, "a*.txt")))
    sys.path.insert(0, str(root))
    import seeded_tasks

    registry = dt.Registry()
    seeded_tasks.register(registry)
    cache_dir = str(root / "cache")
    for name in SEEDED_LENGTHS:
        cache_task_in_process(registry.get_task(name), "train", task_dir(cache_dir, name, "train"))
    return str(root), cache_dir, registry


def _reader(env, converter, numpy_path=True, task="np_task", lengths=LENGTHS, **kwargs):
    _, cache_dir, registry = env
    r = DeterministicReader(
        task,
        cache_dir,
        seed=3,
        global_batch_size=4,
        sequence_length=lengths,
        feature_converter=converter,
        registry=registry,
        **kwargs,
    )
    if not numpy_path:
        for s in r.streams:
            s.numpy_stage = None
    return r


def _tf_twin(converter):
    """The same converter through TensorFlow (a subclass has no NumPy conversion)."""
    kind = type(converter)
    twin = type("TF" + kind.__name__, (kind,), {})
    kwargs = {"pack": converter.pack, "bos_id": converter.bos_id}
    if isinstance(converter, dt.PrefixLMFeatureConverter):
        kwargs["loss_on_targets_only"] = converter.loss_on_targets_only
    return twin(**kwargs)


CONVERTERS = [
    dt.EncDecFeatureConverter(pack=True),
    dt.EncDecFeatureConverter(pack=False),
    dt.LMFeatureConverter(pack=True),
    dt.LMFeatureConverter(pack=False, bos_id=5),
    dt.PrefixLMFeatureConverter(pack=True),
    dt.PrefixLMFeatureConverter(pack=False, loss_on_targets_only=False),
]
# First-fit plans packed rows only.
CASES = [(c, "greedy") for c in CONVERTERS] + [(c, "first_fit") for c in CONVERTERS if c.pack]


@pytest.mark.parametrize(("converter", "packing"), CASES, ids=lambda v: repr(v) if not isinstance(v, str) else v)
def test_numpy_path_equals_tensorflow_path(np_env, converter, packing):
    fast = _reader(np_env, converter, packing=packing)
    slow = _reader(np_env, _tf_twin(converter), numpy_path=False, packing=packing)
    assert fast.streams[0].numpy_stage is not None
    _same_batches(fast, slow)
    assert slow.streams[0].tf_stage is not None


def _same_batches(fast, slow, steps=(0, 1, 2, 7, 40)):
    for step in steps:
        a, b = fast.batch_at(step), slow.batch_at(step)
        assert sorted(a) == sorted(b)
        # The batch's shapes and dtypes, from the spec alone (nothing read), are the batches'.
        assert {k: (v.shape, v.dtype) for k, v in a.items()} == fast.batch_spec() == slow.batch_spec()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{k} at step {step}")


def test_reads_without_importing_tensorflow(np_env):
    root, cache_dir, registry = np_env
    runs = [
        ["encdec_packed", "np_task", "EncDecFeatureConverter", True, LENGTHS],
        ["lm_unpacked", "np_task", "LMFeatureConverter", False, LENGTHS],
    ]
    got = _child(root, cache_dir, "np_tasks", runs)
    assert got["tensorflow_imported"] is False
    for name, conv in (
        ("encdec_packed", dt.EncDecFeatureConverter(pack=True)),
        ("lm_unpacked", dt.LMFeatureConverter(pack=False)),
    ):
        r = _reader(np_env, _tf_twin(conv), numpy_path=False)
        assert got[name] == [det_run.digest(b) for b in r.batches_at(0, 6)], name


SEEDED_CASES = [
    ("np_sc", dt.EncDecFeatureConverter(pack=True)),
    ("np_sc", dt.EncDecFeatureConverter(pack=False)),
    ("np_lm", dt.LMFeatureConverter(pack=True)),
    ("np_lm", dt.LMFeatureConverter(pack=False)),
]


@pytest.mark.parametrize(("task", "converter"), SEEDED_CASES, ids=lambda v: repr(v))
def test_seeded_numpy_path_equals_tensorflow_path(seeded_env, task, converter):
    lengths = SEEDED_LENGTHS[task]
    fast = _reader(seeded_env, converter, task=task, lengths=lengths)
    slow = _reader(seeded_env, _tf_twin(converter), numpy_path=False, task=task, lengths=lengths)
    stage = fast.streams[0].numpy_stage
    assert stage is not None and stage.seeded
    assert [step.seeded for step in stage.fns] == ([True, False] if task == "np_sc" else [True])
    _same_batches(fast, slow)  # step 40 is in a later epoch
    assert slow.streams[0].tf_stage.per_record
    # The seed matters: another reader seed gives other batches.
    other = DeterministicReader(
        task,
        seeded_env[1],
        seed=4,
        global_batch_size=4,
        sequence_length=lengths,
        feature_converter=converter,
        registry=seeded_env[2],
    )
    a, b = fast.batch_at(0), other.batch_at(0)
    assert any(not np.array_equal(a[k], b[k]) for k in a)


def test_seeded_tasks_read_without_importing_tensorflow(seeded_env):
    root, cache_dir, registry = seeded_env
    runs = [
        ["sc_packed", "np_sc", "EncDecFeatureConverter", True, SEEDED_LENGTHS["np_sc"]],
        ["lm_unpacked", "np_lm", "LMFeatureConverter", False, SEEDED_LENGTHS["np_lm"]],
    ]
    got = _child(root, cache_dir, "seeded_tasks", runs)
    assert got["tensorflow_imported"] is False
    for name, task, conv in (
        ("sc_packed", "np_sc", dt.EncDecFeatureConverter(pack=True)),
        ("lm_unpacked", "np_lm", dt.LMFeatureConverter(pack=False)),
    ):
        r = _reader(seeded_env, _tf_twin(conv), numpy_path=False, task=task, lengths=SEEDED_LENGTHS[task])
        assert got[name] == [det_run.digest(b) for b in r.batches_at(0, 6)], name


def test_seeded_preprocessor_without_numpy_fn_uses_tensorflow(det_env):
    data_dir, cache_dir, registry = det_env
    tf_registry = dt.Registry()
    det_tasks.make(data_dir, tf_registry, tf_noise=True)  # det_a ends with `noise_tf` (seeded, no numpy_fn)
    r = _reader((None, cache_dir, tf_registry), dt.EncDecFeatureConverter(pack=True), task="det_a")
    assert r.streams[0].numpy_stage is None
    assert r.streams[0].tf_stage.per_record
    # det_env's det_a (`noise` with its NumPy twin) reads the same batches without TensorFlow.
    fast = _reader((None, cache_dir, registry), dt.EncDecFeatureConverter(pack=True), task="det_a")
    assert fast.streams[0].numpy_stage is not None and fast.streams[0].numpy_stage.seeded
    _same_batches(fast, r, steps=(0, 40))


def test_other_layouts_fall_back_to_tensorflow():
    specs = {"targets": FeatureSpec("int32", 1)}
    good = serialize({"targets": np.array([5, 300, 7], np.int32)}, specs)
    np.testing.assert_array_equal(record_stage.decode([good], specs, ["targets"])["targets"].values, [5, 300, 7])
    # The same ids as an unpacked repeated field (tag 0x08 per value): valid protobuf, not
    # the cache's layout.
    unpacked = bytes([0x0A, 0x13, 0x0A, 0x11, 0x0A, 0x07]) + b"targets" + bytes([0x12, 0x06, 0x1A, 0x04, 8, 5, 8, 7])
    with pytest.raises(record_stage.WireFormatError):
        record_stage.decode([unpacked], specs, ["targets"])
    with pytest.raises(record_stage.WireFormatError):
        record_stage.decode([good[:-1]], specs, ["targets"])
