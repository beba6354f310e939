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


def test_a_dry_run_that_does_not_fit_is_one_line_and_writes_nothing(tmp_path, standard):
    texts, cache_dir = standard
    model_dir = tmp_path / "run"
    args = [
        f"--config={launch_util.T5_CONFIG}",
        f"--config.model_dir={model_dir}",
        f"--config.data.cache_dir={cache_dir}",
        "--config.data.batch_size=8",
        "--dry_run",
        "--memory_limit_gib=0.00048828125",  # 2**-11 GiB = 512 KiB: the step needs megabytes
    ]
    proc = launch_util.train(args, env={"CAIRN_SHAKESPEARE_DIR": texts})
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
