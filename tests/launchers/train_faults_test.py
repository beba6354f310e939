"""User mistakes and faults at the train and cache_tasks entry points, in child processes: each
exits 2 with one line (no traceback), and a refused run leaves model_dir as it was. Every run is
a process forked from one interpreter that imported the train program (`forked`, a
`launch_util.ForkServer`; the runs that fail are the `refused` fixture's; the full disk is
injected into that process alone).

The child processes run on 2 CPU devices (`launch_util.devices`): no fault here depends on
the mesh, and a training child on 2 devices costs about half the CPU of one on 8."""

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import launch_util
import pytest

devices = launch_util.devices_fixture(2)


@pytest.fixture(scope="module")
def standard(tmp_path_factory):
    """The standard runs' texts and task cache (`launch_util.standard_data`)."""
    return launch_util.standard_data(tmp_path_factory.mktemp("standard"))


@pytest.fixture(scope="module")
def texts(standard):
    return standard[0]


@pytest.fixture(scope="module")
def cache_dir(standard):
    return standard[1]


TRAIN = "cairn.launchers.train_main"


@pytest.fixture(scope="module")
def forked(devices):
    """The train program (and cache_tasks) in processes forked from one interpreter."""
    with launch_util.ForkServer(TRAIN, preload=("cairn.models", "cairn.trainer")) as server:
        yield server


def small(model_dir, cache_dir, steps, *extra):
    return [
        f"--config={launch_util.T5_CONFIG}",
        f"--config.model_dir={model_dir}",
        f"--config.data.cache_dir={cache_dir}",
        f"--config.num_train_steps={steps}",
        "--config.data.batch_size=8",
        "--config.trainer.log_every=2",
        "--config.post_training.num_samples=0",
        "--config.post_training.final_eval=false",
        *extra,
    ]


def one_error_line(proc) -> str:
    """The single `error: ...` line on stderr (exit status 2, no traceback)."""
    assert proc.returncode == 2, launch_util.tail(proc)
    assert "Traceback" not in proc.stderr, launch_util.tail(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, launch_util.tail(proc)
    return errors[0]


def tree(d: pathlib.Path) -> dict:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def flip_a_byte_in_every_state_file(model_dir: pathlib.Path) -> None:
    for f in (model_dir / "checkpoints").glob("*/state/**/*"):
        if f.is_file() and f.stat().st_size:
            data = bytearray(f.read_bytes())
            data[len(data) // 2] ^= 0xFF
            f.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def refused(forked, tmp_path_factory, texts, cache_dir):
    """The runs here that fail (the programs refusing them, or the fault they train into), each
    set up here and then run in its own process forked from one interpreter that imported train
    (`forked.call`: its own exit status, stdout and stderr); the tests assert on
    them. `{case: (process, ...)}`."""
    tmp = tmp_path_factory.mktemp("refused")
    texts_env = {"CAIRN_SHAKESPEARE_DIR": texts}
    runs, cases = [], {}

    def add(case, module, argv, env, *facts):
        cases[case] = (len(runs), facts)
        runs.append((module, argv, env))

    # Every checkpoint corrupt: a 2-step run (its own child process), a byte flipped in each file.
    corrupt = tmp / "corrupt"
    proc = forked.run(small(corrupt, cache_dir, 2), env=texts_env)
    assert proc.returncode == 0, launch_util.tail(proc)
    assert sorted(os.listdir(corrupt / "checkpoints")) == ["2"]
    flip_a_byte_in_every_state_file(corrupt)
    corrupt_argv = small(corrupt, cache_dir, 4)
    corrupt_before = tree(corrupt)

    # A lock held by a live process on this host, taken 1h 2m ago.
    locked = tmp / "locked"
    locked.mkdir()
    (locked / "config.json").write_text('{"the": "first run"}\n')
    (locked / "fingerprint").mkdir()
    (locked / "fingerprint" / "header.json").write_text('{"the": "first run"}\n')
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    lock = {"pid": holder.pid, "host": socket.gethostname(), "time": time.time() - 3725}
    (locked / "cairn.lock").write_text(json.dumps(lock))
    add("locked", TRAIN, small(locked, cache_dir, 2, "--config.fingerprint_every=1"), texts_env, locked, tree(locked))

    # cache_tasks on a missing and on an empty source.
    (tmp / "empty").mkdir()
    for source in ("missing", "empty"):
        argv = [f"--config={launch_util.T5_CONFIG}", f"--config.data.cache_dir={tmp / 'c'}"]
        add(f"source_{source}", "cairn.launchers.cache_main", argv, {"CAIRN_SHAKESPEARE_DIR": str(tmp / source)}, tmp)

    # A cache with a shard gone (the standard cache, copied), and a missing source.
    gone = tmp / "cache_gone"
    shutil.copytree(cache_dir, gone)
    split_dir = gone / "shakespeare_span_corruption" / "train"
    shard = sorted(p for p in split_dir.iterdir() if p.name.endswith(".array_record"))[0]
    shard.unlink()
    add("shard_gone", TRAIN, small(tmp / "run_shard", gone, 2), texts_env, tmp / "run_shard", shard.name)
    missing_env = {"CAIRN_SHAKESPEARE_DIR": str(tmp / "no")}
    add("no_source", TRAIN, small(tmp / "run_source", tmp / "c2", 2), missing_env, tmp / "run_source")

    # A model_dir under a file, and one that cannot be written.
    (tmp / "a_file").write_text("x")
    for model_dir, why in ((tmp / "a_file" / "run", "is not a directory"), ("/proc/cairn_run", "cannot write")):
        add(f"unwritable {why}", TRAIN, small(model_dir, cache_dir, 2), texts_env, model_dir, why)

    add("corrupt", TRAIN, corrupt_argv, texts_env, corrupt, corrupt_before)

    # Runs that train into a fault: a NaN loss (learning rate 1e30), a full disk at the second
    # checkpoint (an injected ENOSPC).
    nan = tmp / "nan"
    argv = small(nan, cache_dir, 8, "--config.optimizer.schedule=constant")
    argv += ["--config.optimizer.learning_rate=1e30", "--config.trainer.checkpoint_every=1"]
    add("nan", TRAIN, argv, texts_env, nan)
    full = tmp / "full"
    argv = small(full, cache_dir, 40, "--config.trainer.checkpoint_every=2")
    runs.append((TRAIN, argv, texts_env, DISK_FULL))
    cases["disk_full"] = (len(runs) - 1, (full,))

    try:
        procs = [forked.call(*run[:3], timeout=600, prelude=run[3] if len(run) > 3 else "") for run in runs]
    finally:
        holder.kill()
        holder.wait()
    return {case: (procs[i], *facts) for case, (i, facts) in cases.items()}


@pytest.mark.parametrize("source", ["missing", "empty"])
def test_cache_tasks_on_a_missing_or_empty_source_is_one_line(refused, source):
    proc, tmp = refused[f"source_{source}"]
    line = one_error_line(proc)
    assert "task 'shakespeare_span_corruption' (split 'train'): its source cannot be read" in line
    assert str(tmp / source) in line


def test_a_held_lock_is_refused_before_anything_is_written(refused):
    proc, model_dir, before = refused["locked"]
    line = one_error_line(proc)
    lock = json.loads((model_dir / "cairn.lock").read_text())
    assert f"in use by pid {lock['pid']} on host {socket.gethostname()} (taken 1h 2m " in line
    assert tree(model_dir) == before  # config.json, the fingerprint header and the lock untouched


def test_data_errors_are_found_before_anything_is_written(refused):
    """A cache with a shard gone (found when the reader opens it, after the config checks) and a
    missing source: model_dir is not even created."""
    proc, model_dir, shard = refused["shard_gone"]
    assert shard in one_error_line(proc)
    assert not model_dir.exists()
    proc, model_dir = refused["no_source"]
    assert "its source cannot be read: no *_gut.txt play texts in" in one_error_line(proc)
    assert not model_dir.exists()


def test_an_unwritable_model_dir_or_one_under_a_file_is_one_line(refused):
    for why in ("is not a directory", "cannot write"):
        proc, model_dir, _ = refused[f"unwritable {why}"]
        line = one_error_line(proc)
        assert line.startswith("error: config key 'model_dir': directory ") and str(model_dir) in line and why in line
    _, model_dir, _ = refused["unwritable is not a directory"]
    assert model_dir.parent.read_text() == "x"


def test_every_checkpoint_corrupt_exits_2_unless_restart_if_corrupt(forked, refused, texts, cache_dir):
    proc, model_dir, before = refused["corrupt"]
    line = one_error_line(proc)
    assert f"every checkpoint in {model_dir / 'checkpoints'} is unusable (step 2: checkpoint " in line
    assert "same size, other bytes" in line and "--restart_if_corrupt" in line
    # A refused run writes nothing: config.json (the rerun asks for 4 steps, not 2), the
    # fingerprint, the summaries and the checkpoints are byte for byte as before (nothing moved:
    # a rerun says the same).
    assert tree(model_dir) == before
    proc = forked.run(small(model_dir, cache_dir, 4, "--restart_if_corrupt"), env={"CAIRN_SHAKESPEARE_DIR": texts})
    assert proc.returncode == 0, launch_util.tail(proc)
    assert "trained to step 4" in proc.stdout and "starting again from step 0" in proc.stderr
    assert sorted(os.listdir(model_dir / "corrupt_checkpoints")) == ["2"]


def test_a_nan_stop_is_one_line_with_the_step_and_the_checkpoint_kept(refused):
    proc, model_dir = refused["nan"]
    line = one_error_line(proc)
    assert " at step " in line and "training stopped and " in line
    step = int(line.split(" at step ")[1].split(";")[0])
    assert f"the last good checkpoint (step {step - 1}) is kept in {model_dir}" in line
    assert sorted(int(s) for s in os.listdir(model_dir / "checkpoints"))[-1] == step - 1


# Run in the forked child before the train program (`forked.call`'s prelude).
DISK_FULL = textwrap.dedent(
    """
    import errno
    import orbax.checkpoint as ocp
    real_save = ocp.CheckpointManager.save

    def save(self, step, *args, **kwargs):  # the disk fills up at the second checkpoint
        if step >= 4:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.directory))
        return real_save(self, step, *args, **kwargs)

    ocp.CheckpointManager.save = save
    """
)


def test_a_full_disk_is_one_line_with_the_path_and_free_space(refused):
    proc, model_dir = refused["disk_full"]
    line = one_error_line(proc)
    assert line.startswith(f"error: no space left on device writing checkpoint step 4 in {model_dir} (")
    assert " free); the last good checkpoint (step 2) is intact" in line
    assert "trained to step" not in proc.stdout
    assert sorted(os.listdir(model_dir / "checkpoints")) == ["2"]
    assert not (model_dir / "cairn.lock").exists()
