"""Multi-slice from a config: `partitioning.num_slices` / `partitioning.dcn_mesh` are validated,
build a hybrid mesh (data parallel across slices), and two simulated slices (2 processes x 4
CPU devices on 127.0.0.1, one slice per process; mesh data=2 across the slices, model=4 inside
each) train the standard run like one slice of 1 process x 8 devices with that mesh (the standard
run "t5_data2_model4", tests/fixtures/standard_runs.py, trained once per build; checked with
`verify --rtol=1e-5`: losses, batch fingerprints and parameter checksums)."""

import jax
import launch_util
import numpy as np
import pytest
import standard_runs as sr

from cairn.launchers import builder, config_base, config_io, run_spec, schema
from cairn.launchers.validation import ConfigError

RUN_TIMEOUT_S = 600  # one 12-step run of 2 processes (about 40 s on a quiet 2-core machine)


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
        run_spec.checked_keys(_config(**partitioning))
    assert e.value.key == key and text in str(e.value), str(e.value)


def test_defaults_and_valid_slice_keys_pass():
    run_spec.checked_keys(_config())
    run_spec.checked_keys(_config(num_slices=4, dcn_mesh={"data": -1, "fsdp": 2}, mesh={"fsdp": 2}))


def _partitioner(config):
    """`builder.make_partitioner` of `config`'s `MeshSpec` (its schema not checked) on this process's
    devices: what `run_spec.bind` builds."""
    mesh = run_spec.MeshSpec.of(schema.typed(config_io.to_plain(config)))
    return builder.make_partitioner(mesh, mesh.resolve(jax.device_count()), jax.devices(), 1)


def test_make_partitioner_builds_the_hybrid_mesh():
    """One process, 8 devices: slices are contiguous runs (devices 0-3, 4-7); each slice is a
    contiguous block along the DCN axis, and the slices hold different data rows."""
    assert jax.device_count() == 8
    slice_of = np.vectorize(lambda d: d.id // 4)
    mesh = _partitioner(_config(num_slices=2, mesh={"data": 4, "model": 2})).mesh
    assert dict(mesh.shape) == {"data": 4, "fsdp": 1, "model": 2}
    np.testing.assert_array_equal(slice_of(mesh.devices)[:, 0, :], [[0, 0], [0, 0], [1, 1], [1, 1]])
    mesh = _partitioner(
        _config(num_slices=2, mesh={"data": 2, "fsdp": 2, "model": 2}, dcn_mesh={"data": 1, "fsdp": 2})
    ).mesh
    np.testing.assert_array_equal(slice_of(mesh.devices)[:, :, 0], [[0, 1], [0, 1]])
    single = _partitioner(_config(mesh={"data": 4, "model": 2})).mesh
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
        _partitioner(_config(**partitioning))
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
def test_two_simulated_slices_train_like_one_slice(tmp_path):
    """Two slices, one per process: mesh data=2 (one across the slices) x model=4 (inside each),
    the standard run's flags and its archive's texts and cache (so the slices cache nothing),
    against the standard run of 1 process x 8 devices with the same mesh: same losses, batch
    fingerprints and parameter checksums within rtol 1e-5 (the configs differ only in
    `partitioning.num_slices`, hence `--allow_config_diff`)."""
    standard = sr.unpack(tmp_path)
    two = tmp_path / "two_slices"
    args = sr.overrides(two, standard.cache, extra=(*sr.MESH_DATA2_MODEL4, "--config.partitioning.num_slices=2"))
    address = f"127.0.0.1:{sr.free_port()}"
    # --verbose: both processes log their mesh and data shard (by default only process 0 speaks)
    argvs = [args + sr.multihost_flags(address, 2, i) + ["--verbose"] for i in range(2)]
    # The two processes forked together from one interpreter that imported the train program.
    procs = launch_util.run_forked(
        "cairn.launchers.train_main",
        argvs,
        env=sr.child_env(standard.texts, 4),
        timeout=RUN_TIMEOUT_S,
        preload=("cairn.models", "cairn.trainer"),
        together=True,
    )
    for i, proc in enumerate(procs):
        assert proc.returncode == 0, launch_util.tail(proc)
        text = proc.stderr + proc.stdout
        assert "hybrid mesh over 2 slices" in text and f"process {i} reads data shard {i} of 2" in text, text[-3000:]
    one = standard.run("t5_data2_model4")
    assert "hybrid mesh" not in standard.log("t5_data2_model4") + standard.log("t5_data2_model4", stream="out")
    verify = sr.verify(two, one, "--rtol=1e-5", "--allow_config_diff")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert f"identical through step {sr.STEPS}" in verify.stdout and "data fingerprint: same" in verify.stdout, (
        verify.stdout
    )
    assert f"{sr.STEPS // sr.FINGERPRINT_EVERY} batch fingerprints compared" in verify.stdout, verify.stdout
