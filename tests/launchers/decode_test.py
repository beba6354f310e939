"""Decoding through the entry points (child processes, two short plays, `decode_tasks.py`):
the decoder-only twin trained with `eval.decode_metrics` writes prediction metrics at its eval
steps; `eval --decode` continues prompts (a task's `inputs`, else the first half of `targets`)
and compares the continuation without the prompt; `infer` in its three modes over a two-task
mixture writes one file per task in input order, and a killed infer resumes to the same files;
infer of the LM twin continues the prompts of an `--input_file`; the T5 twin's decode metrics
during training and its scores. Infers whose files are the point, and `eval --decode`, run in
this process (`launch_util.infer_in_process`, `eval_main.evaluate`); a killed infer and an
unknown mode run the entry point as a child (the killed infer's resumption, whose files are the
point, in this process). The child processes (training, infer) are forked from one interpreter
that imported the programs' libraries and TensorFlow (`launch_util.ForkServer`).

Everything here runs on 2 CPU devices (`launch_util.devices`: this process and the ones it
starts), a mesh of data=2: no property of decoding needs 8, and a training child on 2 costs about
half the CPU of one on 8. The runs compared (the training's evaluation with `eval --decode`,
`eval --decode` with infer, a killed infer with an uninterrupted one) share that layout."""

import json
import math
import os
import pathlib
import re
import signal
import sys
import time
from unittest import mock

import launch_util
import pytest

from cairn.launchers.validation import ConfigError

devices = launch_util.devices_fixture(2, this_process=True)
HERE = str(pathlib.Path(__file__).absolute().parent)
LM_TASK, PREFIX_TASK, SPAN_TASK, MIX = (
    "shakespeare_lm_decode",
    "shakespeare_prefix_lm",
    "shakespeare_span_corruption_decode",
    "shakespeare_decode_mix",
)
MODULES = "--config.data.task_modules=('cairn.launchers.tasks.shakespeare', 'decode_tasks')"
EXAMPLES = 4
# The trainings evaluate (and decode) every 2 steps, the last step included (the loop's
# evaluation): the final evaluation after training would repeat the last one.
TRAIN_EVAL = [
    "--config.trainer.eval_every=2",
    "--config.eval.decode_metrics=true",
    "--config.post_training.final_eval=false",
]


def _env(tmp):
    path = os.pathsep.join([HERE, *(p for p in sys.path if p)])
    return {"CAIRN_SHAKESPEARE_DIR": launch_util.small_texts(tmp), "PYTHONPATH": path}


def eval_rows(path, task="eval"):
    rows = [json.loads(line) for line in open(path)]
    return [r for r in rows if r.get("task") == task]


@pytest.fixture(scope="module")
def train(devices):
    """The programs in processes forked from one interpreter that imported the train program,
    TensorFlow (both runs cache their tasks) and the libraries it trains with
    (`launch_util.ForkServer`), on the module's `devices`: `train.run(args, ...)` trains,
    `train.call(module, args, ...)` and `train.popen(...)` run eval and infer."""
    preload = ("tensorflow", "cairn.models", "cairn.trainer")
    env = {"PYTHONPATH": os.pathsep.join([HERE, *(p for p in sys.path if p)])}  # decode_tasks
    with launch_util.ForkServer("cairn.launchers.train_main", env=env, preload=preload) as server:
        yield server


@pytest.fixture(scope="module")
def lm(train, tmp_path_factory):
    """The LM twin, 4 steps, evaluated (with decoding) at steps 2 and 4 on the mixture."""
    tmp = tmp_path_factory.mktemp("decode_lm")
    env = _env(tmp)
    common = [
        f"--config={launch_util.LM_CONFIG}",
        f"--config.model_dir={tmp / 'run'}",
        f"--config.data.cache_dir={tmp / 'cache'}",
        "--config.num_train_steps=4",
        "--config.data.batch_size=8",
        f"--config.eval.num_examples={EXAMPLES}",
        "--config.eval.batch_size=4",
        MODULES,
        f"--config.eval.task={MIX}",
        "--config.post_training.decode_method=greedy",
        "--config.post_training.max_decode_length=8",
    ]
    proc = train.run(common + TRAIN_EVAL, env=env, timeout=600)
    assert proc.returncode == 0, launch_util.tail(proc)
    return tmp, common, env, proc


def test_decode_metrics_during_training(lm):
    tmp, _, _, proc = lm
    rows = eval_rows(tmp / "run" / "summaries" / "metrics.jsonl")
    keys = {
        f"{LM_TASK}/sequence_accuracy",
        f"{LM_TASK}/bleu",
        f"{LM_TASK}/perplexity",
        f"{PREFIX_TASK}/sequence_accuracy",
    }
    for step in (2, 4):
        got = {r["metric"]: r["value"] for r in rows if r["step"] == step}
        assert keys <= set(got), (step, sorted(got))
        assert all(math.isfinite(got[k]) for k in keys), got
    assert "needs predict_fn" not in proc.stdout + proc.stderr
    # TensorBoard (the trainer's writers): the same keys at both eval steps.
    import tensorflow as tf

    tags = set()
    for f in (tmp / "run" / "tensorboard" / "eval").glob("events.*"):
        for event in tf.compat.v1.train.summary_iterator(str(f)):
            tags |= {(event.step, v.tag) for v in event.summary.value}
    assert {(s, f"eval/{k}") for s in (2, 4) for k in keys} <= tags, sorted(tags)


@pytest.fixture(scope="module")
def evaluated(lm):
    """`eval --decode` of step 4, in this process (`eval_main.evaluate(..., decode=True)`, what
    the program runs once its flags are parsed, on the run's saved config; the entry point's own
    process is eval_infer_test's and eval_infer_multiprocess_test's): `(metrics, LM task example
    rows, prefix-LM task example rows)`."""
    from cairn.launchers import config_io, eval_main

    tmp, _, env, _ = lm
    with mock.patch.dict(os.environ, env):
        config = config_io.resolve_paths(config_io.load_saved_config(str(tmp / "run" / "config.json")))
        printed = []
        assert list(
            eval_main.evaluate(launch_util.spec(config), str(tmp / "run"), 4, decode=True, out=printed.append)
        ) == [4], printed
    out_dir = tmp / "run" / "eval" / "validation"
    metrics = [json.loads(line) for line in open(out_dir / "evaluated.jsonl")][-1]["metrics"]
    rows = [_lines(out_dir / "examples" / f"{t}-00000004.jsonl") for t in (LM_TASK, PREFIX_TASK)]
    return metrics, rows[0], rows[1]


def _stripped(prediction, prompt):
    """Neither starts the other: greedy decoding of a forced prompt would give the prompt first."""
    return prediction and not prediction.startswith(prompt) and not prompt.startswith(prediction)


def test_eval_decode_continues_prompts_and_strips_them(lm, evaluated):
    tmp = lm[0]
    metrics, lm_rows, prefix_rows = evaluated
    # The same decoding as the training run's evaluation at step 4: the same numbers.
    trained = {r["metric"]: r["value"] for r in eval_rows(tmp / "run" / "summaries" / "metrics.jsonl")}
    for task, name in ((LM_TASK, "bleu"), (LM_TASK, "perplexity"), (PREFIX_TASK, "sequence_accuracy")):
        assert metrics[task][name] == pytest.approx(trained[f"{task}/{name}"], rel=1e-6), (task, name)
    assert [r["index"] for r in lm_rows] == list(range(EXAMPLES))
    for r in lm_rows + prefix_rows:
        assert {"inputs", "targets", "prediction"} <= set(r), r
        assert _stripped(r["prediction"], r["inputs"]), r
    assert all("score" in r for r in lm_rows)  # the LM task also has perplexity


def _infer(model_dir, env, out, chunk_size=2, **kwargs):
    """Infer in this process on the run's saved config (`launch_util.infer_in_process`); the
    lines it printed."""
    return "\n".join(launch_util.infer_in_process(model_dir, out, env, chunk_size=chunk_size, **kwargs))


def _lines(path):
    return [json.loads(line) for line in open(path)]


@pytest.fixture(scope="module")
def predicted(lm):
    """infer (mode predict, chunks of 2) of the LM twin over the mixture, in this process:
    `{task: its file}`."""
    tmp, _, env, _ = lm
    _infer(tmp / "run", env, tmp / "pred.jsonl")
    return {t: tmp / f"pred-{t}.jsonl" for t in (LM_TASK, PREFIX_TASK)}


def test_infer_modes_write_one_file_per_task_in_input_order(train, lm, evaluated, predicted):
    tmp, common, env, _ = lm
    files = predicted
    pred = {t: _lines(f) for t, f in files.items()}
    for t, rows in pred.items():
        assert [r["index"] for r in rows] == list(range(EXAMPLES)), t
        assert all(len(r["prediction_ids"]) <= 8 and _stripped(r["prediction"], r["input"]) for r in rows), rows
    # The prefix-LM task's prompt is its inputs (6 tokens) and the target its 6 next tokens; the
    # LM task (targets only) is continued from the first half of each example, the target the rest.
    assert all(r["input"] and r["target"] for r in pred[PREFIX_TASK] + pred[LM_TASK])
    # eval --decode's example rows hold the same prompts, targets and predictions.
    _, lm_rows, prefix_rows = evaluated
    assert [(r["inputs"], r["targets"]) for r in lm_rows] == [(r["input"], r["target"]) for r in pred[LM_TASK]]
    assert [r["prediction"] for r in prefix_rows] == [r["prediction"] for r in pred[PREFIX_TASK]]

    _infer(tmp / "run", env, tmp / "aux.jsonl", mode="predict_with_aux")
    for t in files:
        aux = _lines(tmp / f"aux-{t}.jsonl")
        assert [{k: v for k, v in r.items() if k != "aux"} for r in aux] == pred[t]
        assert all(r["aux"]["scores"] < 0 for r in aux), aux

    _infer(tmp / "run", env, tmp / "score.jsonl", mode="score")
    for t in files:
        scores = _lines(tmp / f"score-{t}.jsonl")
        assert [(r["index"], r["input"], r["target"]) for r in scores] == [
            (r["index"], r["input"], r["target"]) for r in pred[t]
        ]
        assert all(math.isfinite(r["score"]) and r["score"] < 0 for r in scores), scores

    # Another mode into the same parts is refused; an unknown mode is one line, exit 2 (the
    # entry point in a child process).
    with pytest.raises(ConfigError, match="holds parts of other predictions"):
        _infer(tmp / "run", env, tmp / "pred.jsonl", mode="score")
    proc = train.call("cairn.launchers.infer_main", common + [f"--output={tmp / 'x.jsonl'}", "--mode=scores"], env=env)
    assert proc.returncode == 2, launch_util.tail(proc)
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: config key 'mode': unknown mode 'scores'; allowed: predict, score, predict_with_aux"
    )


def test_killed_infer_resumes_to_the_same_files(train, lm, predicted):
    """infer SIGKILLed (a child process) after its first part, resumed (in this process: what the
    killed process left on disk is the point) to the files of an uninterrupted infer
    (`predicted`'s, in chunks of 2: a chunk of 1 row is padded to the 2 devices, so both decode
    with the same program and the same rows)."""
    tmp, _, env, _ = lm
    out = tmp / "killed.jsonl"
    args = [f"--config={tmp / 'run' / 'config.json'}", f"--output={out}", "--chunk_size=1"]
    first_parts = pathlib.Path(f"{tmp / 'killed'}-{LM_TASK}.jsonl.parts")
    child = train.popen("cairn.launchers.infer_main", args, os.devnull, os.devnull, env=env)
    try:
        deadline = time.monotonic() + 600
        while not (first_parts / "part-00000.jsonl").exists():
            assert child.poll() is None and time.monotonic() < deadline, "infer ended before its first chunk"
            time.sleep(0.02)
        os.killpg(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    second = pathlib.Path(f"{tmp / 'killed'}-{PREFIX_TASK}.jsonl")
    assert not second.exists(), "killed too late: nothing left to resume"
    printed = _infer(tmp / "run", env, out, chunk_size=1)
    done = re.search(
        rf"{EXAMPLES} predictions of step 4 in \S+{LM_TASK}\.jsonl \((\d) chunks computed, (\d) resumed", printed
    )
    assert done and int(done.group(2)) >= 1 and int(done.group(1)) + int(done.group(2)) == EXAMPLES, printed
    for t, file in predicted.items():
        assert (tmp / f"killed-{t}.jsonl").read_text() == file.read_text(), t


def test_infer_of_the_lm_twin_continues_the_lines_of_an_input_file(lm):
    """A decoder-only model (the family's `continues_prompt`) continues `--input_file`'s lines
    (one file, empty targets); the prediction excludes the prompt. (Moved here from
    eval_infer_test, which trained an LM twin for it; the first half of each evaluation example
    continued is `test_infer_modes_write_one_file_per_task_in_input_order`'s LM task.)"""
    tmp, _, env, _ = lm
    prompts = tmp / "prompts.txt"
    prompts.write_text("ROMEO. O, she\n\nTo be, or not\n")
    out = tmp / "file.jsonl"
    _infer(tmp / "run", env, out, chunk_size=8, input_file=str(prompts))
    rows = _lines(out)
    assert [(r["index"], r["input"], r["target"]) for r in rows] == [(0, "ROMEO. O, she", ""), (1, "To be, or not", "")]
    # At most max_decode_length (8) new tokens after each prompt, whatever its length.
    assert all(all(isinstance(t, int) for t in r["prediction_ids"]) for r in rows), rows
    assert all(len(r["prediction_ids"]) <= 8 for r in rows), rows


def test_t5_decode_metrics_during_training_and_scores(train, tmp_path):
    env = _env(tmp_path)
    common = [
        f"--config={launch_util.T5_CONFIG}",
        f"--config.model_dir={tmp_path / 'run'}",
        f"--config.data.cache_dir={tmp_path / 'cache'}",
        "--config.num_train_steps=2",
        "--config.data.batch_size=8",
        f"--config.eval.num_examples={EXAMPLES}",
        "--config.eval.batch_size=4",
        "--config.post_training.num_samples=0",
        MODULES,
        f"--config.eval.task={SPAN_TASK}",
    ]
    proc = train.run(common + TRAIN_EVAL, env=env, timeout=600)
    assert proc.returncode == 0, launch_util.tail(proc)
    got = {r["metric"] for r in eval_rows(tmp_path / "run" / "summaries" / "metrics.jsonl") if r["step"] == 2}
    assert {f"{SPAN_TASK}/sequence_accuracy", f"{SPAN_TASK}/perplexity"} <= got, got
    out = tmp_path / "scores.jsonl"
    _infer(tmp_path / "run", env, out, mode="score")
    rows = _lines(out)
    assert [r["index"] for r in rows] == list(range(EXAMPLES))
    assert all("<extra_id_0>" in r["input"] and r["score"] < 0 for r in rows), rows
