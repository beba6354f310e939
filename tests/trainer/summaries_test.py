"""Summaries: process 0 writes metrics.jsonl (and TensorBoard files, and any extra writer);
every process logs its values (DEBUG on one process, INFO with a prefix naming it on several)."""

import json
import logging

import pytest

from cairn.trainer.summaries import SummaryWriter
from cairn.trainer.writers import TensorBoardWriter


def test_the_primary_writer_writes_files_and_logs(tmp_path, caplog):
    writer = SummaryWriter(tmp_path, tensorboard=False)
    with caplog.at_level(logging.DEBUG, logger="cairn.trainer"):
        writer.scalars("train", 3, {"loss": 1.5})
        writer.scalars("train", 4, {"loss": 1.25}, quiet=True)
    writer.close()
    rows = [json.loads(x) for x in (tmp_path / "summaries" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["metric"], r["value"]) for r in rows] == [(3, "loss", 1.5), (4, "loss", 1.25)]
    assert "train step 3: loss=1.5" in caplog.text and "step 4" not in caplog.text


def test_other_processes_write_nothing_and_log_with_their_name(tmp_path, caplog):
    writer = SummaryWriter(
        tmp_path, tensorboard=True, primary=False, log_prefix="process 1/2: ", log_level=logging.INFO, wandb="p"
    )
    with caplog.at_level(logging.INFO, logger="cairn.trainer"):
        writer.scalars("train", 3, {"loss": 1.5, "mfu": 0.25})
    writer.close()
    assert list(tmp_path.iterdir()) == []  # no metrics.jsonl, no TensorBoard files
    assert "process 1/2: train step 3: loss=1.5  mfu=0.25" in caplog.text


def test_one_process_logs_its_values_at_debug_only(tmp_path, caplog):
    writer = SummaryWriter(tmp_path, tensorboard=False)
    with caplog.at_level(logging.INFO, logger="cairn.trainer"):
        writer.scalars("train", 3, {"loss": 1.5})
    writer.close()
    assert caplog.text == ""  # the console's progress line shows the figures


class Recorder:
    """A pluggable writer: keeps what it is given."""

    def __init__(self, fail_on_close=False):
        self.rows, self.flushes, self.closed, self.fail_on_close = [], 0, False, fail_on_close

    def write(self, task, step, values, quiet=False):
        self.rows.append((task, step, dict(values), quiet))

    def flush(self):
        self.flushes += 1

    def close(self):
        self.closed = True
        if self.fail_on_close:
            raise OSError("disk full")


def test_extra_writers_get_every_row_and_are_flushed_and_closed(tmp_path):
    first, second = Recorder(fail_on_close=True), Recorder()
    writer = SummaryWriter(tmp_path, tensorboard=False, extra=[first, second])
    writer.scalars("train", 1, {"loss": 2.0}, quiet=True)
    writer.scalars("eval", 2, {"t/perplexity": 9.0})
    writer.flush()
    assert first.rows == [("train", 1, {"loss": 2.0}, True), ("eval", 2, {"t/perplexity": 9.0}, False)]
    assert first.flushes == 1
    with pytest.raises(OSError, match="disk full"):
        writer.close()
    assert second.closed  # closed although the first writer failed
    rows = [json.loads(x) for x in (tmp_path / "summaries" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["task"], r["step"]) for r in rows] == [("train", 1), ("eval", 2)]


def test_tensorboard_takes_the_logged_steps_only(tmp_path):
    """Only logged steps reach TensorBoard, as the scalar summaries `tf.summary.scalar` writes
    (read back by TensorFlow), and writing them does not import TensorFlow."""
    import sys

    writer = TensorBoardWriter(str(tmp_path))
    writer.write("train", 1, {"loss": 2.0}, quiet=True)
    assert not (tmp_path / "tensorboard").exists()
    writer.write("train", 2, {"loss": 1.5, "accuracy": 0.25})
    writer.write("train", 4, {"loss": 1.25, "accuracy": 0.5})
    writer.close()
    assert "tensorflow" not in sys.modules
    (events,) = [f for f in (tmp_path / "tensorboard" / "train").iterdir() if f.name.startswith("events.")]

    import tensorflow as tf

    got = []
    for event in tf.compat.v1.train.summary_iterator(str(events)):
        for v in event.summary.value:
            assert v.metadata.plugin_data.plugin_name == "scalars"
            got.append((event.step, v.tag, float(tf.make_ndarray(v.tensor))))
    assert got == [
        (2, "train/accuracy", 0.25),
        (2, "train/loss", 1.5),
        (4, "train/accuracy", 0.5),
        (4, "train/loss", 1.25),
    ]
