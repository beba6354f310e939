"""Metric writers: Weights & Biases offline (its local run directory read back), and a Trainer
logging to W&B through the `wandb` config field (wandb is pinned in requirements.lock)."""

import glob
import struct
import time

from mesh_util import make_partitioner
from tiny_model import CountingIterator, TinyModel
from wandb.proto import wandb_internal_pb2

from cairn.trainer import OptimizerConfig, Trainer, TrainerConfig
from cairn.trainer.writers import WandbWriter, wandb_run_id

BLOCK, HEADER = 32768, 7  # the run file: a LevelDB-style log of protobuf records


def history(run_dir_root, rows=1, wait_s=60.0):
    """`[(step, {key: value})]` of the history records in the offline run file under `root`,
    once it holds at least `rows` of them (W&B's own process writes the file; on a loaded
    machine its last records may land just after `finish()` returns), or after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        got = _history(run_dir_root)
        if len(got) >= rows or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def _history(run_dir_root):
    (path,) = glob.glob(f"{run_dir_root}/wandb/offline-run-*/run-*.wandb")
    data = open(path, "rb").read()
    pos, records, pending = HEADER, [], b""  # a 7-byte file header (":W&B", magic, version)
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        pending += chunk
        if kind in (1, 4):  # FULL or LAST
            records.append(pending)
            pending = b""
    out = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): i.value_json for i in record.history.item}
            out.append((int(items.pop("_step")), {k: float(v) for k, v in items.items() if not k.startswith("_")}))
    return out


def test_wandb_writer_logs_the_logged_steps_offline(tmp_path):
    writer = WandbWriter(str(tmp_path), "cairn-test", name="run")
    writer.write("train", 1, {"loss": 3.0}, quiet=True)  # a per-step row between logs: JSON lines only
    writer.write("train", 2, {"loss": 2.5, "learning_rate": 0.01})
    writer.write("eval", 2, {"task/perplexity": 12.0})
    writer.close()
    rows = history(tmp_path, 1)
    assert [step for step, _ in rows] == [2]  # one W&B step holds both tasks' values
    assert rows[0][1] == {"train/loss": 2.5, "train/learning_rate": 0.01, "eval/task/perplexity": 12.0}
    assert wandb_run_id(str(tmp_path)) in glob.glob(f"{tmp_path}/wandb/offline-run-*")[0]


def test_trainer_logs_to_wandb_when_asked(tmp_path):
    cfg = TrainerConfig(model_dir=str(tmp_path), num_train_steps=4, log_every=2, tensorboard=False, wandb="cairn-test")
    # The 4 x 2 set-up of the group's other modules: its programs come from the compilation cache.
    Trainer(TinyModel(), OptimizerConfig(), 0.01, make_partitioner(4, 2), cfg).train(CountingIterator())
    rows = history(tmp_path, 2)
    assert [step for step, _ in rows] == [2, 4]
    assert all("train/loss" in values and "train/steps_per_second" in values for _, values in rows)
