"""Summaries: process 0 writes metrics.jsonl (and TensorBoard files); every process logs its
values, with a prefix naming it."""

import json
import logging

from cairn.trainer.summaries import SummaryWriter


def test_the_primary_writer_writes_files_and_logs(tmp_path, caplog):
    writer = SummaryWriter(tmp_path, tensorboard=False)
    with caplog.at_level(logging.INFO, logger="cairn.trainer"):
        writer.scalars("train", 3, {"loss": 1.5})
        writer.scalars("train", 4, {"loss": 1.25}, quiet=True)
    writer.close()
    rows = [json.loads(x) for x in (tmp_path / "summaries" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["metric"], r["value"]) for r in rows] == [(3, "loss", 1.5), (4, "loss", 1.25)]
    assert "train step 3: loss=1.5" in caplog.text and "step 4" not in caplog.text


def test_other_processes_write_nothing_and_log_with_their_name(tmp_path, caplog):
    writer = SummaryWriter(tmp_path, tensorboard=True, primary=False, log_prefix="process 1/2: ")
    with caplog.at_level(logging.INFO, logger="cairn.trainer"):
        writer.scalars("train", 3, {"loss": 1.5, "mfu": 0.25})
    writer.close()
    assert list(tmp_path.iterdir()) == []  # no metrics.jsonl, no TensorBoard files
    assert "process 1/2: train step 3: loss=1.5  mfu=0.25" in caplog.text
