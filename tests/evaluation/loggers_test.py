import json

import numpy as np

from cairn.evaluation.loggers import JsonLinesLogger, TensorBoardLogger


def test_json_lines_rows(tmp_path):
    logger = JsonLinesLogger(tmp_path)
    logger.log_metrics("task_a", 100, {"bleu": np.float32(12.5), "accuracy": 50.0})
    logger.log_metrics("task_a", 200, {"bleu": 13.0})
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [
        {"task": "task_a", "step": 100, "metric": "accuracy", "value": 50.0},
        {"task": "task_a", "step": 100, "metric": "bleu", "value": 12.5},
        {"task": "task_a", "step": 200, "metric": "bleu", "value": 13.0},
    ]
    examples = [{"index": 0, "inputs": b"in", "targets": "t", "prediction": "p", "score": np.float64(-1.5)}]
    logger.log_examples("task_a", 100, examples)
    logger.log_examples("task_a", 100, examples)  # rewriting a step replaces it
    lines = (tmp_path / "examples" / "task_a-00000100.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == [
        {"index": 0, "inputs": "in", "targets": "t", "prediction": "p", "score": -1.5}
    ]


def test_tensorboard_event_files(tmp_path):
    import tensorflow as tf

    logger = TensorBoardLogger(tmp_path)
    logger.log_metrics("task_a", 7, {"accuracy": 75.0})
    logger.log_examples("task_a", 7, [{"inputs": "x", "targets": "y", "prediction": "z"}])
    logger.close()
    (event_file,) = (tmp_path / "task_a").glob("events.out.tfevents.*")
    scalars, texts = {}, []
    for event in tf.compat.v1.train.summary_iterator(str(event_file)):
        for value in event.summary.value:
            if value.tag == "eval/accuracy":
                scalars[event.step] = float(tf.make_ndarray(value.tensor))
            if value.tag == "samples":
                texts.append(tf.make_ndarray(value.tensor).item().decode())
    assert scalars == {7: 75.0}
    assert "**prediction**: z" in texts[0]
