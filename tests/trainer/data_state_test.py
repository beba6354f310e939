"""tf.data iterators are checkpointed with tf.train.Checkpoint and resume where they stopped."""

import json

import numpy as np
from mesh_util import make_partitioner
from tiny_model import LENGTH, VOCAB, TinyModel

from cairn.trainer import OptimizerConfig, TfDataIterator, Trainer, TrainerConfig


def _tf_iterator():
    import tensorflow as tf

    ds = tf.data.Dataset.range(10_000).shuffle(256, seed=3, reshuffle_each_iteration=False)
    ds = ds.map(lambda i: tf.cast((i * 7 + tf.range(LENGTH, dtype=tf.int64)) % VOCAB, tf.int32))
    ds = ds.batch(16).map(lambda x: {"inputs": x, "targets": (x * 7 + 3) % VOCAB})
    return iter(ds)


def _losses(model_dir):
    rows = [json.loads(line) for line in open(model_dir / "summaries" / "metrics.jsonl")]
    return {r["step"]: r["value"] for r in rows if r["metric"] == "loss"}


def _train(model_dir, steps):
    cfg = TrainerConfig(
        model_dir=str(model_dir), num_train_steps=steps, log_every=1, checkpoint_every=2, tensorboard=False
    )
    # The 4 x 2 set-up of the group's other modules: its programs come from the compilation cache.
    return Trainer(TinyModel(), OptimizerConfig(), 0.01, make_partitioner(4, 2), cfg).train(_tf_iterator())


def test_tf_data_iterator_resumes_exactly(tmp_path):
    straight = _train(tmp_path / "a", 6)
    _train(tmp_path / "b", 3)
    resumed = _train(tmp_path / "b", 6)
    assert _losses(tmp_path / "a") == _losses(tmp_path / "b")
    np.testing.assert_array_equal(np.asarray(straight.state.params["wi"]), np.asarray(resumed.state.params["wi"]))
    assert (tmp_path / "b" / "tf_data" / "6" / "process_0").is_dir()


def test_wrapper_state_round_trip(tmp_path):
    it = TfDataIterator(_tf_iterator(), tmp_path)
    next(it)
    state = it.get_state()
    expected = next(it)["inputs"]
    other = TfDataIterator(_tf_iterator(), tmp_path)
    other.set_state(state)
    assert other.position == 1 and state["tf_checkpoint"] == "tf_data/1"
    np.testing.assert_array_equal(next(other)["inputs"], expected)
