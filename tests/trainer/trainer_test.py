"""`Trainer.train`: summaries, evaluation, checkpoints, resume, fine-tuning, config errors."""

import json
import logging

import jax
import numpy as np
import pytest
from mesh_util import make_partitioner
from tiny_model import CountingIterator, TinyModel, make_batch

from cairn.trainer import CheckpointConfig, Checkpointer, OptimizerConfig, Trainer, TrainerConfig, restore_params

# The tests share two trainer set-ups (their programs are compiled once per process):
# Adafactor on a 4 x 2 mesh, and AdamW (clipped) on 2 x 4. Neither property depends on which.
ADAMW = OptimizerConfig(name="adamw", clip_grad_norm=1.0)


def _adafactor(model_dir, steps, eval_fn=None, step_hooks=(), **config):
    cfg = TrainerConfig(model_dir=str(model_dir), num_train_steps=steps, tensorboard=False, **config)
    return Trainer(TinyModel(), OptimizerConfig(), 0.01, make_partitioner(4, 2), cfg, eval_fn, step_hooks=step_hooks)


def _rows(model_dir):
    with open(model_dir / "summaries" / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def test_train_writes_summaries_evaluates_and_checkpoints(tmp_path, caplog):
    calls = []

    def eval_fn(params, step):
        calls.append(step)
        return {"toy_task": {"accuracy": 0.5 + step / 100}}

    cfg = TrainerConfig(
        model_dir=str(tmp_path),
        num_train_steps=6,
        log_every=3,
        checkpoint_every=4,
        eval_every=3,
        checkpoint=CheckpointConfig(keep=5),
        tensorboard=True,
        peak_flops=1e12,  # on CPU no peak is known: MFU only with one given
    )
    trainer = Trainer(
        TinyModel(), ADAMW, 1e-3, make_partitioner(2, 4), cfg, eval_fn=eval_fn, experiment_config={"name": "toy"}
    )
    with caplog.at_level(logging.DEBUG, logger="cairn.trainer"):
        result = trainer.train(CountingIterator())
    assert result.step == 6 and not result.preempted
    assert "estimated memory per device" in caplog.text and "opt_state" in caplog.text
    assert calls == [3, 6]
    rows = _rows(tmp_path)
    train = {(r["step"], r["metric"]) for r in rows if r["task"] == "train"}
    assert {(s, "loss") for s in range(1, 7)} <= train
    for name in (
        "accuracy",
        "z_loss",
        "learning_rate",
        "grad_norm",
        "tokens_per_second",
        "sequences_per_second",
        "step_time_s",
        "mfu",
    ):
        assert (6, name) in train, name
    mfu = [r["value"] for r in rows if r["metric"] == "mfu"]
    assert all(0 < v < 1 for v in mfu)
    assert ("eval", 6, "toy_task/accuracy") in {(r["task"], r["step"], r["metric"]) for r in rows}
    assert list((tmp_path / "tensorboard" / "train").glob("events.out.tfevents.*"))
    ckpt = Checkpointer(tmp_path)
    try:
        assert ckpt.all_steps() == [4, 6]
        _, _, data, config = ckpt.restore(trainer.abstract_state)
    finally:
        ckpt.close()
    assert data == {"position": 6} and config == {"name": "toy"}


def test_resume_continues_where_it_stopped(tmp_path):
    def run(steps):
        return _adafactor(tmp_path, steps, log_every=1).train(CountingIterator())

    assert run(3).step == 3
    result = run(5)
    assert result.step == 5 and int(result.state.step) == 5
    steps = [r["step"] for r in _rows(tmp_path) if r["metric"] == "loss"]
    assert steps == [1, 2, 3, 4, 5]


def test_fine_tune_from_pretrained_params(tmp_path):
    pre = tmp_path / "pretrain"
    pretrained = _adafactor(pre, 2).train(CountingIterator()).state.params
    # Fine-tuned with another optimizer on another mesh.
    ft = Trainer(
        TinyModel(),
        ADAMW,
        1e-3,
        make_partitioner(2, 4),
        TrainerConfig(model_dir=str(tmp_path / "ft"), num_train_steps=1, tensorboard=False),
    )
    ft.setup(make_batch(0, 0))
    params = restore_params(pre, ft.abstract_state.params)
    np.testing.assert_array_equal(np.asarray(params["wi"]), np.asarray(pretrained["wi"]))
    result = ft.train(CountingIterator(), init_params=params)
    assert result.step == 1
    assert not np.array_equal(np.asarray(result.state.params["wi"]), np.asarray(pretrained["wi"]))


def test_plain_iterator_without_state_trains_with_a_warning(tmp_path, caplog):
    trainer = _adafactor(tmp_path, 2)
    with caplog.at_level(logging.WARNING):
        result = trainer.train(make_batch(0, i) for i in range(10))
    assert result.step == 2 and "no get_state/set_state" in caplog.text


@pytest.mark.parametrize("field,value", [("num_train_steps", 0), ("num_microbatches", 0), ("log_every", -1)])
def test_bad_config_names_the_field(tmp_path, field, value):
    kwargs = {"model_dir": str(tmp_path), "num_train_steps": 5, field: value}
    with pytest.raises(ValueError, match=f"TrainerConfig.{field}"):
        TrainerConfig(**kwargs)


def test_pair_init_protocol(tmp_path):
    """A model whose init returns (params, logical_specs) works too."""
    base = TinyModel()

    class PairModel:
        loss_fn = staticmethod(base.loss_fn)

        def init(self, rng, batch):
            import flax.linen as nn

            boxed = base.init(rng, batch)
            return nn.meta.unbox(boxed), nn.get_partition_spec(boxed)

    t = Trainer(
        PairModel(),
        OptimizerConfig(),
        0.01,
        make_partitioner(4, 2),
        TrainerConfig(model_dir=str(tmp_path), num_train_steps=1, tensorboard=False),
    )
    t.setup(make_batch(0, 0))
    state = t.initial_state()
    assert state.params["wi"].sharding.spec == jax.sharding.PartitionSpec(None, "model")


def test_step_hooks_see_every_step_after_eval(tmp_path):
    events = []

    def eval_fn(params, step):
        events.append(("eval", step))
        return {"toy": {"accuracy": 0.0}}

    def hook(step, state):
        assert int(state.step) == step  # the state after this step
        events.append(("hook", step, float(np.asarray(state.params["scale"]).sum())))

    def second(step, state):
        events.append(("second", step))

    trainer = _adafactor(tmp_path, 4, eval_fn, [hook, second], eval_every=2, log_every=2)
    result = trainer.train(CountingIterator())
    assert result.step == 4
    assert [e[:2] for e in events] == [
        ("hook", 1),
        ("second", 1),
        ("eval", 2),
        ("hook", 2),
        ("second", 2),
        ("hook", 3),
        ("second", 3),
        ("eval", 4),
        ("hook", 4),
        ("second", 4),
    ]
    hooked = [e[2] for e in events if e[0] == "hook"]
    assert hooked[-1] == pytest.approx(float(np.asarray(result.state.params["scale"]).sum()))


def test_step_hooks_must_be_callable(tmp_path):
    cfg = TrainerConfig(model_dir=str(tmp_path), num_train_steps=1, tensorboard=False)
    with pytest.raises(TypeError, match="step_hooks"):
        Trainer(TinyModel(), OptimizerConfig(), 0.01, make_partitioner(8, 1), cfg, step_hooks=[42])


class _ReadCounter(CountingIterator):
    def __init__(self, batch_size: int = 16):
        super().__init__(batch_size=batch_size)
        self.reads = 0

    def __next__(self):
        self.reads += 1
        return super().__next__()


def test_set_up_once_and_one_read_per_step(tmp_path):
    """`setup` before `train` (as the launcher does for pretrained params) is not repeated and
    no batch is peeked; without it, `train` peeks one. Both train the same numbers."""

    def trainer(name):
        cfg = TrainerConfig(model_dir=str(tmp_path / name), num_train_steps=3, log_every=1, tensorboard=False)
        return Trainer(TinyModel(), OptimizerConfig(), 0.01, make_partitioner(4, 2), cfg)

    set_up = trainer("set_up")
    abstract = set_up.setup(make_batch(0, 0))
    step_fn = set_up.train_step
    assert set_up.setup(make_batch(0, 5)) is abstract and set_up.train_step is step_fn
    data = _ReadCounter()
    result = set_up.train(data)
    assert result.step == 3 and data.reads == 3 and set_up.train_step is step_fn
    peeked, data = trainer("peeked"), _ReadCounter()
    other = peeked.train(data)
    assert data.reads == 4  # the peek (put back), then one read per step
    for a, b in zip(jax.tree.leaves(result.state), jax.tree.leaves(other.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    mismatched = trainer("mismatched")
    mismatched.setup(make_batch(0, 0, batch_size=8))
    with pytest.raises(ValueError, match="set up for"):
        mismatched.train(_ReadCounter())
