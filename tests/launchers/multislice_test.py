"""Multi-slice from a config: `partitioning.num_slices` / `partitioning.dcn_mesh` are validated,
build a hybrid mesh (data parallel across slices), and two simulated slices (2 processes x 4
CPU devices on 127.0.0.1, one slice per process) train the tiny config like one slice of
1 process x 8 devices (checked with `verify --rtol=1e-5`, losses and parameter checksums)."""

import os
import signal
import socket
import subprocess
import sys

import jax
import launch_util
import numpy as np
import pytest

from cairn.launchers import builder, config_base, validation
from cairn.launchers.validation import ConfigError

RUN_TIMEOUT_S = 380  # one 4-step run (about 60 s on a quiet 2-core machine); two runs fit "large" (900 s)


def _config(**partitioning):
    c = config_base.base_config()
    for key, value in partitioning.items():
        if isinstance(value, dict):
            for axis, size in value.items():
                c.partitioning[key][axis] = size
        else:
            c.partitioning[key] = value
    return c


@pytest.mark.parametrize(
    "partitioning,key,text",
    [
        (dict(num_slices=0), "partitioning.num_slices", "must be >= 1, got 0"),
        (dict(num_slices=2, dcn_mesh={"data": 0}), "partitioning.dcn_mesh.data", "positive int or -1, got 0"),
        (dict(num_slices=2, dcn_mesh={"data": -1, "fsdp": -1}), "partitioning.dcn_mesh", "at most one axis may be -1"),
        (
            dict(num_slices=4, dcn_mesh={"data": 2}),
            "partitioning.dcn_mesh",
            "spans 2 slices, but partitioning.num_slices is 4",
        ),
        (
            dict(num_slices=3, dcn_mesh={"fsdp": 2}),
            "partitioning.dcn_mesh",
            "fixed axes span 2 slices, which does not divide",
        ),
        (dict(num_slices=2, mesh={"data": 3}), "partitioning.dcn_mesh.data", "mesh.data=3 is not a multiple of 2"),
    ],
)
def test_slice_keys_are_checked_with_the_config(partitioning, key, text):
    with pytest.raises(ConfigError) as e:
        validation.check_schema(_config(**partitioning))
    assert e.value.key == key and text in str(e.value), str(e.value)


def test_defaults_and_valid_slice_keys_pass():
    validation.check_schema(_config())
    validation.check_schema(_config(num_slices=4, dcn_mesh={"data": -1, "fsdp": 2}, mesh={"fsdp": 2}))


def test_make_partitioner_builds_the_hybrid_mesh():
    """One process, 8 devices: slices are contiguous runs (devices 0-3, 4-7); each slice is a
    contiguous block along the DCN axis, and the slices hold different data rows."""
    assert jax.device_count() == 8
    slice_of = np.vectorize(lambda d: d.id // 4)
    mesh = builder.make_partitioner(_config(num_slices=2, mesh={"data": 4, "model": 2})).mesh
    assert dict(mesh.shape) == {"data": 4, "fsdp": 1, "model": 2}
    np.testing.assert_array_equal(slice_of(mesh.devices)[:, 0, :], [[0, 0], [0, 0], [1, 1], [1, 1]])
    mesh = builder.make_partitioner(
        _config(num_slices=2, mesh={"data": 2, "fsdp": 2, "model": 2}, dcn_mesh={"data": 1, "fsdp": 2})
    ).mesh
    np.testing.assert_array_equal(slice_of(mesh.devices)[:, :, 0], [[0, 1], [0, 1]])
    single = builder.make_partitioner(_config(mesh={"data": 4, "model": 2})).mesh
    assert single.devices.shape == (4, 1, 2)


@pytest.mark.parametrize(
    "partitioning,key,text",
    [
        (dict(num_slices=3), "partitioning.num_slices", "3 slices do not divide the 1 process(es), 8 devices"),
        (
            dict(num_slices=2, mesh={"data": 1, "model": -1}),
            "partitioning.dcn_mesh.data",
            "axis 'data' of mesh {'data': 1, 'fsdp': 1, 'model': 8} cannot span 2 slices",
        ),
    ],
)
def test_slices_that_do_not_fit_the_devices(partitioning, key, text):
    with pytest.raises(ConfigError) as e:
        builder.make_partitioner(_config(**partitioning))
    assert e.value.key == key and text in str(e.value), str(e.value)


def test_a_slice_count_that_does_not_fit_exits_2_with_one_line(tmp_path):
    model_dir = tmp_path / "run"
    proc = launch_util.train(
        [
            f"--config={launch_util.T5_CONFIG}",
            f"--config.model_dir={model_dir}",
            f"--config.data.cache_dir={tmp_path / 'cache'}",
            "--config.partitioning.num_slices=3",
        ],
        env={"CAIRN_SHAKESPEARE_DIR": launch_util.small_texts(tmp_path)},
        timeout=240,
    )
    assert proc.returncode == 2, launch_util.tail(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: config key 'partitioning.num_slices': 3 slices do not divide the 1 process(es), 8 devices"
    ], launch_util.tail(proc)
    assert "Traceback" not in proc.stderr
    assert not model_dir.exists() or not any(model_dir.iterdir()), "model_dir was written"


# -- two simulated slices against one slice -----------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _args(model_dir, cache_dir, *extra):
    return [
        f"--config={launch_util.T5_CONFIG}",
        f"--config.model_dir={model_dir}",
        f"--config.data.cache_dir={cache_dir}",
        "--config.num_train_steps=4",
        "--config.data.batch_size=8",
        "--config.partitioning.mesh.data=4",
        "--config.partitioning.mesh.model=2",
        "--config.fingerprint_every=2",
        "--config.trainer.log_every=1",
        "--config.trainer.tensorboard=false",
        "--config.post_training.final_eval=false",
        "--config.post_training.num_samples=0",
        *extra,
    ]


def _run_all(procs, logs):
    """Waits for every process (one deadline); kills their process groups if any is left."""
    try:
        for p in procs:
            p.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"timed out after {RUN_TIMEOUT_S}s:\n{logs[0].read_text()[-3000:]}") from None
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, f"{log}: rc={p.returncode}\n{log.read_text()[-3000:]}"


def _start(args, env, log):
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cairn.launchers.train_main", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=str(launch_util.REPO),
            start_new_session=True,
        )


def test_two_simulated_slices_train_like_one_slice(tmp_path):
    texts, cache = launch_util.small_texts(tmp_path), tmp_path / "cache"
    env = dict(os.environ, CAIRN_SHAKESPEARE_DIR=texts, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    port = _free_port()
    # Two slices: one per process, mesh data=4 (2 across slices x 2 inside), model=2 (inside).
    two = tmp_path / "two_slices"
    logs = [tmp_path / f"slice{i}.log" for i in range(2)]
    procs = [
        _start(
            _args(
                two,
                cache,
                "--config.partitioning.num_slices=2",
                f"--config.multihost.coordinator_address=127.0.0.1:{port}",
                "--config.multihost.num_processes=2",
                f"--config.multihost.process_id={i}",
            ),
            dict(env, XLA_FLAGS="--xla_force_host_platform_device_count=4"),
            log,
        )
        for i, log in enumerate(logs)
    ]
    _run_all(procs, logs)
    for i, log in enumerate(logs):
        text = log.read_text()
        assert "hybrid mesh over 2 slices" in text and f"process {i} reads data shard {i} of 2" in text, text[-3000:]
    # One slice: 1 process x 8 devices, the same mesh.
    one = tmp_path / "one_slice"
    one_log = tmp_path / "one.log"
    _run_all(
        [_start(_args(one, cache), dict(env, XLA_FLAGS="--xla_force_host_platform_device_count=8"), one_log)], [one_log]
    )
    assert "hybrid mesh" not in one_log.read_text()
    # Same losses, parameter checksums and batch rows within rtol 1e-5 (the configs differ only in
    # partitioning.num_slices, hence --allow_config_diff).
    verify = launch_util.run(
        "cairn.launchers.verify",
        [f"--run_a={two}", f"--run_b={one}", "--rtol=1e-5", "--allow_config_diff"],
        timeout=120,
    )
    assert verify.returncode == 0, launch_util.tail(verify)
    assert "identical through step 4" in verify.stdout and "data fingerprint: same" in verify.stdout, verify.stdout
