"""Resume safety end to end (child processes, the default experiment shrunk): the default
model_dir under the user's directory, printed first; a changed setting refused before anything
is written (exit 2, each key old -> new, the two ways on), or allowed with `--allow_changed`;
nothing left to train is "already at step N of N", exit 0; a run's config.json given back as
`--config` reproduces the run (`verify` says equal). Both tests start from one run (the
`first_run` fixture: the run whose config.json is given back is the one later refused and resumed).

The child processes run on 2 CPU devices (`launch_util.devices`): every run compared here is
one of its own, on the same 2, and a training child on 2 devices costs about half the CPU of one
on 8. The train program's runs are processes forked from one interpreter that imported it and
the libraries it trains with (`launch_util.ForkServer`): each its own exit status and output,
without a new interpreter's start-up and imports each."""

import json
import os

import launch_util
import pytest

devices = launch_util.devices_fixture(2)


@pytest.fixture(scope="module")
def standard(tmp_path_factory):
    """The standard runs' texts and task cache (`launch_util.standard_data`)."""
    return launch_util.standard_data(tmp_path_factory.mktemp("standard"))


@pytest.fixture(scope="module")
def train(devices):
    """`train(args, env)`: the train program, forked (the module's `devices` in its environment)."""
    with launch_util.ForkServer("cairn.launchers.train_main", preload=("cairn.models", "cairn.trainer")) as server:
        yield server.run


@pytest.fixture(scope="module")
def texts(standard):
    return standard[0]


@pytest.fixture(scope="module")
def cache_dir(standard):
    return standard[1]


def short(cache_dir, steps, *extra):
    return [
        f"--config={launch_util.T5_CONFIG}",
        f"--config.data.cache_dir={cache_dir}",
        f"--config.num_train_steps={steps}",
        "--config.data.batch_size=8",
        "--config.trainer.log_every=1",
        "--config.fingerprint_every=2",
        "--config.trainer.tensorboard=False",
        "--config.post_training.final_eval=False",
        "--config.post_training.num_samples=0",
        *extra,
    ]


def snapshot(model_dir):
    """Every file under model_dir with its bytes (what a refused run must not change)."""
    out = {}
    for root, _, files in os.walk(model_dir):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, model_dir)] = f.read()
    return out


@pytest.fixture(scope="module")
def first_run(train, tmp_path_factory, texts, cache_dir):
    """The run both tests start from, 4 steps in the default model_dir under the user's
    directory, with a model override (kept in config.json); and a second run trained from its
    config.json (`--config=<model_dir>/config.json`) with `verify` on the two, before the first
    one is resumed: `(model_dir, env, first process, second process, verify process)`."""
    tmp = tmp_path_factory.mktemp("resume")
    env = {"CAIRN_SHAKESPEARE_DIR": texts, "BUILD_WORKING_DIRECTORY": str(tmp)}
    model_dir = tmp / "runs" / "shakespeare_t5_tiny"  # the default, under the user's directory
    first = train(short(cache_dir, 4, DROPOUT), env=env)
    assert first.returncode == 0, launch_util.tail(first)
    again = train([f"--config={model_dir / 'config.json'}", f"--config.model_dir={tmp / 'b'}"], env=env)
    assert again.returncode == 0, launch_util.tail(again)
    verify = launch_util.run("cairn.launchers.verify", [f"--run_a={model_dir}", f"--run_b={tmp / 'b'}"])
    return model_dir, env, first, again, verify


DROPOUT = "--config.model.overrides.dropout_rate=0.0"


def test_changed_settings_are_refused_or_allowed_and_a_finished_run_says_so(train, first_run, cache_dir):
    model_dir, env, first, _, _ = first_run
    assert first.stdout.splitlines()[0] == f"model_dir: {model_dir}"
    assert json.loads((model_dir / "config.json").read_text())["model_dir"] == "runs/shakespeare_t5_tiny"
    before = snapshot(model_dir)

    # A changed learning rate (and the final learning rate derived from it) is refused.
    refused = train(short(cache_dir, 6, DROPOUT, "--config.optimizer.learning_rate=0.01"), env=env)
    assert refused.returncode == 2, launch_util.tail(refused)
    assert "Traceback" not in refused.stderr and "loss nan" not in refused.stdout
    err = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1, launch_util.tail(refused)
    assert "optimizer.learning_rate: 0.003 -> 0.01" in err[0]
    assert "optimizer.final_learning_rate: 0.00030000000000000003 -> 0.001" in err[0]
    assert "num_train_steps" not in err[0]  # allowed to change on resume
    assert "--config.model_dir" in err[0]
    assert "--allow_changed=optimizer.final_learning_rate,optimizer.learning_rate" in err[0]
    assert snapshot(model_dir) == before  # config.json not overwritten, nothing written

    # The same run again: nothing left to train.
    again = train(short(cache_dir, 4, DROPOUT), env=env)
    assert again.returncode == 0, launch_util.tail(again)
    assert "already at step 4 of 4" in again.stdout
    assert "nan" not in again.stdout

    # Allowed explicitly: resumes from step 4 with the new settings, and config.json says so.
    allowed = train(
        short(cache_dir, 6, DROPOUT, "--config.optimizer.learning_rate=0.01", "--allow_changed=optimizer"), env=env
    )
    assert allowed.returncode == 0, launch_util.tail(allowed)
    assert "restored step 4" in allowed.stderr and "trained to step 6" in allowed.stdout
    assert json.loads((model_dir / "config.json").read_text())["optimizer"]["learning_rate"] == 0.01

    unknown = train(short(cache_dir, 6, DROPOUT, "--allow_changed=optimizer.learning_rat"), env=env)
    assert unknown.returncode == 2 and "optimizer.learning_rat" in unknown.stderr, launch_util.tail(unknown)


def test_a_saved_config_reproduces_the_run(first_run):
    """The fixture's second run, from the first one's config.json, trained the same (`verify`)."""
    model_dir, _, _, again, verify = first_run
    saved = json.loads((model_dir / "config.json").read_text())
    assert saved["model"]["overrides"] == {"dropout_rate": 0.0}
    assert "trained to step 4" in again.stdout
    assert verify.returncode == 0, launch_util.tail(verify)
