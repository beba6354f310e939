"""The train entry point end to end, in child processes, on two short plays: the default
experiment shrunk by overrides (checkpoints, TensorBoard, metrics, config.json, fingerprint,
printed model_dir and denoising samples), resuming, SIGTERM (saved, exit 0, resumed), and the LM
twin generating text.

The runs use 2 CPU devices (`launch_util.devices`, a mesh of data=2): what is checked here is
the entry point's behaviour, not a layout, and a training child on 2 devices costs about half the
CPU of one on 8. Training on 8 devices is the standard runs' (tests/fixtures/standard_runs.py).
Every run is a process forked from one interpreter that imported the train program and the
libraries it trains with (`launch_util.ForkServer`), the SIGTERMed one too."""

import json
import os
import signal
import time

import launch_util
import pytest

devices = launch_util.devices_fixture(2)


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    return launch_util.small_texts(tmp_path_factory.mktemp("shakespeare"))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def train(devices):
    """The train program, forked (the module's `devices` in its environment): `train.run(args,
    env)` runs it to its end; `train.popen` starts the one the test SIGTERMs."""
    with launch_util.ForkServer("cairn.launchers.train_main", preload=("cairn.models", "cairn.trainer")) as server:
        yield server


def small(config, model_dir, cache_dir, steps, *extra):
    return [
        f"--config={config}",
        f"--config.model_dir={model_dir}",
        f"--config.data.cache_dir={cache_dir}",
        f"--config.num_train_steps={steps}",
        "--config.data.batch_size=8",
        "--config.eval.num_examples=8",
        "--config.trainer.log_every=2",
        "--config.fingerprint_every=2",
        *extra,
    ]


def losses(model_dir):
    rows = [json.loads(line) for line in open(os.path.join(model_dir, "summaries", "metrics.jsonl"))]
    return {r["step"]: r["value"] for r in rows if r["task"] == "train" and r["metric"] == "loss"}


def test_default_experiment_trains_evaluates_samples_resumes_and_survives_sigterm(
    train, tmp_path, texts, cache_dir, devices
):
    """One run through three processes: 6 steps (caching, the final evaluation, samples); resumed
    from checkpoint 6 with no step limit in sight and SIGTERMed once it trained on (it saves
    and exits 0); resumed from that checkpoint for two more steps."""
    model_dir = tmp_path / "run"
    env = {"CAIRN_SHAKESPEARE_DIR": texts}
    proc = train.run(
        small(launch_util.T5_CONFIG, model_dir, cache_dir, 6, "--config.post_training.num_samples=2"), env=env
    )
    assert proc.returncode == 0, launch_util.tail(proc)
    out = proc.stdout
    assert f"model_dir: {model_dir}" in out
    assert "caching task shakespeare_span_corruption" in out
    assert "final evaluation at step 6: shakespeare_span_corruption (validation): " in out and "perplexity" in out
    for i in range(2):
        assert f"sample {i}:" in out
    sample = out[out.index("sample 0:") :]
    assert "input:" in sample and "target:" in sample and "prediction:" in sample
    assert "<extra_id_0>" in sample.split("target:")[0]  # the input has its sentinels
    assert sorted(os.listdir(model_dir / "checkpoints")) == ["4", "6"]  # checkpoint_every = 6 // 2 + 1
    assert any(f.startswith("events.") for f in os.listdir(model_dir / "tensorboard" / "train"))
    assert sorted(losses(model_dir)) == [1, 2, 3, 4, 5, 6]
    config = json.loads((model_dir / "config.json").read_text())
    assert config["num_train_steps"] == 6 and config["data"]["batch_size"] == 8
    assert config["model_dir"] == str(model_dir)
    header = json.loads((model_dir / "fingerprint" / "header.json").read_text())
    assert header["seed"] == 0 and header["device_count"] == devices and len(header["data_fingerprint"]) == 64
    before = losses(model_dir)

    # Resume with no end in sight (the cache is reused), then SIGTERM once it trained past step 8:
    # it saves a checkpoint and exits 0.
    args = small(
        launch_util.T5_CONFIG,
        model_dir,
        cache_dir,
        100000,
        "--config.post_training.num_samples=0",
        "--config.post_training.final_eval=false",  # no evaluation set up: it never gets there
        "--config.trainer.log_every=1",
    )
    out_path, err_path = tmp_path / "sigterm.out", tmp_path / "sigterm.err"
    proc = train.popen(train.module, args, out_path, err_path, env={"CAIRN_SHAKESPEARE_DIR": texts})
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            if max(losses(model_dir)) >= 8:
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the run ended before SIGTERM"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out, err = out_path.read_text(), err_path.read_text()
    assert proc.returncode == 0, err[-3000:]
    assert "restored step 6" in err and "caching task" not in out
    assert "preempted: checkpoint saved" in out
    (step,) = [int(s) for s in os.listdir(model_dir / "checkpoints") if int(s) > 6]  # the one it saved
    assert step >= 8

    # Resumed from the checkpoint the SIGTERM saved: two more steps.
    proc = train.run(
        small(
            launch_util.T5_CONFIG,
            model_dir,
            cache_dir,
            step + 2,
            "--config.post_training.num_samples=0",
            "--config.post_training.final_eval=false",
        ),
        env=env,
    )
    assert proc.returncode == 0, launch_util.tail(proc)
    assert f"restored step {step}" in proc.stderr and f"trained to step {step + 2}" in proc.stdout
    after = losses(model_dir)
    assert sorted(after) == list(range(1, step + 3)) and all(after[s] == before[s] for s in range(1, 7))
    assert str(step + 2) in os.listdir(model_dir / "checkpoints")


def test_lm_twin_generates_text(train, tmp_path, texts, cache_dir):
    model_dir = tmp_path / "lm"
    proc = train.run(
        small(launch_util.LM_CONFIG, model_dir, cache_dir, 4, "--config.post_training.max_decode_length=8"),
        env={"CAIRN_SHAKESPEARE_DIR": texts},
    )
    assert proc.returncode == 0, launch_util.tail(proc)
    assert "generated 0: ROMEO. O, she doth teach" in proc.stdout
    assert "generated 1: To be, or not to be" in proc.stdout
    line = next(l for l in proc.stdout.splitlines() if l.startswith("generated 0:"))
    assert len(line) > len("generated 0: ROMEO. O, she doth teach") + 3  # something was generated
    assert "final evaluation at step 4: shakespeare_lm (validation)" in proc.stdout
    assert sorted(losses(model_dir)) == [1, 2, 3, 4]


def test_a_parquet_task_from_the_config_alone(train, tmp_path, cache_dir):
    """launchers/configs/parquet_qa_tiny.py over a Parquet file written here, with no task module:
    a column the file lacks is one line (exit 2) before anything is written; then 2 steps trained
    (the task cached, evaluated at the end) and the validation split inferred."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "qa.parquet"
    pairs = {"question": [f"what is {i} plus {i}?" for i in range(80)], "answer": [str(2 * i) for i in range(80)]}
    pq.write_table(pa.table(pairs), path, row_group_size=16)
    config = f"{launch_util.CONFIGS / 'parquet_qa_tiny.py'}:{path}"
    model_dir = tmp_path / "qa"
    proc = train.run(small(config, model_dir, cache_dir, 2, "--config.data.source.columns.targets=answr"))
    assert proc.returncode == 2, launch_util.tail(proc)
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: table file {path} has no column 'answr'; its columns: question, answer"
    )
    assert not model_dir.exists() and not os.path.exists(os.path.join(cache_dir, "parquet_qa"))
    proc = train.run(small(config, model_dir, cache_dir, 2, "--config.post_training.num_samples=0"))
    assert proc.returncode == 0, launch_util.tail(proc)
    assert "caching task parquet_qa (train)" in proc.stdout
    assert "final evaluation at step 2: parquet_qa (validation): " in proc.stdout
    predictions = tmp_path / "predictions.jsonl"
    args = [f"--config={config}", f"--config.model_dir={model_dir}", f"--output={predictions}", "--num_examples=4"]
    proc = train.call("cairn.launchers.infer_main", args)
    assert proc.returncode == 0, launch_util.tail(proc)
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert [(r["input"], r["target"]) for r in rows] == [(f"what is {i} plus {i}?", str(2 * i)) for i in range(72, 76)]
