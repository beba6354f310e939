"""`train --dry_run`: the memory plan of the experiment's train step (compiled on abstract shapes)
and exit; a step that does not fit the device's memory (`--memory_limit_gib`, a pretend device
far smaller than the step) exits 2 with one line: the peak against the limit, the batch search's
answer and the knobs that would help. Nothing is written to model_dir."""

import launch_util
import pytest


@pytest.fixture(scope="module")
def standard(tmp_path_factory):
    """The standard runs' texts and task cache (`launch_util.standard_data`)."""
    return launch_util.standard_data(tmp_path_factory.mktemp("standard"))


def dry_run(model_dir, standard, *flags):
    """`train --dry_run` of the T5 experiment at batch 8 on the standard data, with `flags`."""
    texts, cache_dir = standard
    args = [
        f"--config={launch_util.T5_CONFIG}",
        f"--config.model_dir={model_dir}",
        f"--config.data.cache_dir={cache_dir}",
        "--config.data.batch_size=8",
        "--dry_run",
        *flags,
    ]
    return launch_util.train(args, env={"CAIRN_SHAKESPEARE_DIR": texts})


def test_a_dry_run_that_does_not_fit_is_one_line_and_writes_nothing(tmp_path, standard):
    model_dir = tmp_path / "run"
    # 2**-11 GiB = 512 KiB: the step needs megabytes
    proc = dry_run(model_dir, standard, "--memory_limit_gib=0.00048828125")
    assert proc.returncode == 2, launch_util.tail(proc)
    assert "memory plan: train step at batch 8 on cpu: peak " in proc.stdout and " of 512.00 KiB (" in proc.stdout
    assert "arguments " in proc.stdout and "temporaries " in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, launch_util.tail(proc)
    line = lines[0]
    assert line.startswith("error: the train step at batch 8 needs ") and " of 512.00 KiB device memory on cpu" in line
    # 8 rows over the 8 data shards: no smaller batch to try.
    assert "no batch down to 8 fits (the batch moves in steps of 8 here)" in line
    assert "offload_optimizer_state=True" in line and "param_dtype='bfloat16'" in line
    assert not model_dir.exists()


def test_a_dry_run_for_a_tpu_slice_this_host_does_not_have(tmp_path, standard):
    """`--topology=v5e:1x1`: the step compiled by XLA:TPU for a described v5e chip (libtpu, no
    TPU) and planned against its 15.75 GiB; the T5 experiment's tiny step fits."""
    model_dir = tmp_path / "run"
    proc = dry_run(model_dir, standard, "--topology=v5e:1x1")
    assert proc.returncode == 0, launch_util.tail(proc)
    assert "planning for TPU v5e:1x1: 1 x TPU v5 lite on 1 host" in proc.stdout
    assert "memory plan: train step at batch 8 on TPU v5 lite (tpu): peak " in proc.stdout
    assert " of 15.75 GiB (" in proc.stdout
    assert not model_dir.exists()


def test_topology_needs_dry_run_and_a_name_that_parses():
    from cairn.launchers import entry, train_main

    lines = []
    assert train_main.described_devices(None, True, lines.append) is None
    with pytest.raises(entry.UsageError, match=r"--topology=v5e:1x1 plans for a TPU slice .*: add --dry_run"):
        train_main.described_devices("v5e:1x1", False, lines.append)
    with pytest.raises(entry.UsageError, match=r"--topology: topology 'v5e:3x3': a slice larger than one host"):
        train_main.described_devices("v5e:3x3", True, lines.append)
    two = train_main.described_devices("v5e:2x2", True, lines.append, num_slices=2)  # partitioning.num_slices
    assert len(two) == 8 and sorted({d.slice_index for d in two}) == [0, 1]
    assert lines.pop().startswith("planning for TPU v5e:2x2 x 2 slices: 8 x TPU v5 lite on 2 hosts, ")
    devices = train_main.described_devices("v5e:2x4", True, lines.append)
    assert len(devices) == 8 and lines == [
        "planning for TPU v5e:2x4: 8 x TPU v5 lite on 1 host, "
        "compiled ahead of time by XLA:TPU on this host (nothing runs)"
    ]
