"""The console of a training run captured to a pipe (as a user's file or `| tee` gets it): the
line budget, no TensorFlow/CUDA/absl start-up noise, the progress line, the summary and the
next commands; the final evaluation written at the last step; SIGTERM between metric logs loses
no step.

The runs use 2 CPU devices (`launch_util.devices`): the console says the same on any
mesh, and a training child on 2 devices costs about half the CPU of one on 8. They read the
standard runs' two short plays (`launch_util.standard_data`); the first caches its task in a
fresh cache_dir (a user's first run, TensorFlow's start-up included), the SIGTERMed one reads
the archive's cache (its property is the steps logged, not the caching)."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import launch_util
import pytest

from cairn.launchers.fingerprint import load_run

devices = launch_util.devices_fixture(2)

NOISE = re.compile(
    r"oneDNN|cuda|CUDA|InitializeLog|^[IWE]0000 |WARNING:tensorflow|UserWarning|FutureWarning|DeprecationWarning",
    re.M,
)


@pytest.fixture(scope="module")
def standard(tmp_path_factory):
    """`(texts, cache_dir)`: the standard runs' (`launch_util.standard_data`)."""
    return launch_util.standard_data(tmp_path_factory.mktemp("standard"))


@pytest.fixture(scope="module")
def texts(standard):
    return standard[0]


def train_args(model_dir, cache_dir, steps, *extra):
    return [
        f"--config={launch_util.T5_CONFIG}",
        f"--config.model_dir={model_dir}",
        f"--config.data.cache_dir={cache_dir}",
        f"--config.num_train_steps={steps}",
        "--config.data.batch_size=8",
        "--config.eval.num_examples=8",
        *extra,
    ]


def user_env(texts):
    """The user's environment: none of the tests' quieting variables."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "GRPC_VERBOSITY")}
    env.update(CAIRN_SHAKESPEARE_DIR=texts, JAX_PLATFORMS="cpu")
    env.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    return env


def rows(model_dir):
    with open(model_dir / "summaries" / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def test_the_console_in_a_pipe_is_short_quiet_and_says_what_next(tmp_path, texts):
    model_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "cairn.launchers.train_main"]
        + train_args(model_dir, tmp_path / "cache", 6, "--config.post_training.num_samples=2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream, as `> log 2>&1`
        text=True,
        env=user_env(texts),
        cwd=str(launch_util.REPO),
        timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:]
    lines = out.splitlines()
    assert len(lines) <= 40, out
    assert not NOISE.search(out), NOISE.search(out).group(0) + "\n" + out
    assert re.search(r"^step 6/6 \(100%\) loss [0-9.]+ lr [0-9.e-]+ .*steps/s .*ETA 0s$", out, re.M), out
    assert not re.search(r"train step \d+:", out)  # the 12-metric log lines are gone (--verbose shows them)
    assert "final evaluation at step 6: shakespeare_span_corruption (validation)" in out
    assert re.search(r"^trained to step 6 in \S+ \(total \S+\); loss [0-9.]+$", out, re.M), out
    assert f"  metrics:      {model_dir}/summaries/metrics.jsonl" in lines
    nxt = lines[lines.index("next:") + 1 :]
    assert nxt[0].startswith("  evaluate:     python -m cairn.launchers.eval_main --config=")
    assert f"--config.model_dir={model_dir}" in nxt[0] and "--config.num_train_steps=6" in nxt[0]
    assert nxt[1].endswith(f"--output={model_dir}/predictions.jsonl")
    assert nxt[2].startswith("  export:       python -m cairn.launchers.export --config=")
    assert nxt[2].endswith(f"--output={model_dir}/saved_model")
    assert nxt[3].startswith("  notebook:     from cairn.launchers.interactive import InteractiveModel; model = ")
    assert nxt[4] == (
        f"  loss curve:   python -m cairn.launchers.plot_loss --model_dir={model_dir} --output={model_dir}/loss.png"
    )
    assert nxt[5] == f"  TensorBoard:  tensorboard --logdir {model_dir}/tensorboard"

    # The final evaluation is at the last step in metrics.jsonl and TensorBoard.
    final = {r["metric"]: r["value"] for r in rows(model_dir) if r["task"] == "eval" and r["step"] == 6}
    assert "shakespeare_span_corruption/perplexity" in final, final
    assert any(f.startswith("events.") for f in os.listdir(model_dir / "tensorboard" / "eval"))


def test_sigterm_between_metric_logs_loses_no_step(tmp_path, texts, standard):
    model_dir = tmp_path / "run"
    args = train_args(
        model_dir,
        standard[1],
        100000,
        "--config.post_training.num_samples=0",
        "--config.trainer.log_every=1000",  # no metric log before the SIGTERM
        "--config.trainer.checkpoint_every=3",
        "--config.fingerprint_every=1",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "cairn.launchers.train_main", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=user_env(texts),
        cwd=str(launch_util.REPO),
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            ckpts = model_dir / "checkpoints"
            if ckpts.exists() and any(name.isdigit() and int(name) >= 3 for name in os.listdir(ckpts)):
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the run ended before SIGTERM"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    assert "preempted: checkpoint saved" in out
    step = max(int(s) for s in os.listdir(model_dir / "checkpoints") if s.isdigit())
    run = load_run(model_dir)  # what `verify` reads: every step's loss, none missing
    assert sorted(run.losses) == list(range(1, step + 1)), (step, sorted(run.losses))
