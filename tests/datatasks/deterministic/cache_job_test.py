"""End to end: the `cache_tasks` command on Apache Beam (DirectRunner, 2 worker processes)."""

import os
import subprocess
import sys

import det_tasks
import numpy as np

import cairn.datatasks as dt
from cairn.datatasks.deterministic import CachedTask, DeterministicReader, cache_main, task_dir

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), HERE, *sys.path])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cairn.datatasks.deterministic.cache_main",
            "--tasks=det_.*",
            f"--output_dir={tmp_path / 'out'}",
            "--module_import=beam_tasks",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_cache_tasks_on_beam_matches_the_in_process_cache(det_env, tmp_path, capsys):
    data_dir = tmp_path / "data"
    (tmp_path / "beam_tasks.py").write_text(
        f"import cairn.datatasks as dt\nimport det_tasks\ndet_tasks.make({str(data_dir)!r}, dt.DEFAULT_REGISTRY)\n"
    )
    proc = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "det_a: cached" in proc.stdout and "det_b: cached" in proc.stdout
    registry = dt.Registry()
    det_tasks.make(str(data_dir), registry)
    for name in ("det_a", "det_b"):
        beam = CachedTask(task_dir(str(tmp_path / "out"), name, "train"), registry.get_task(name))
        local = CachedTask(task_dir(det_env[1], name, "train"))
        ids = list(range(local.num_records))
        assert beam.num_records == local.num_records
        assert beam.read(ids) == local.read(ids)  # record i: the same bytes
        np.testing.assert_array_equal(beam.lengths, local.lengths)
    reader = DeterministicReader(
        "det_mix", str(tmp_path / "out"), 7, 4, det_tasks.LENGTHS, dt.EncDecFeatureConverter(), registry=registry
    )
    assert next(reader)["encoder_input_tokens"].shape == (4, 48)
    # A rerun on complete caches does nothing (no pipeline starts; options pass through).
    sys.path.insert(0, str(tmp_path))
    out = str(tmp_path / "out")
    argv = [
        "--tasks=det_.*",
        f"--output_dir={out}",
        "--module_import=beam_tasks",
        "--pipeline_options=--runner=DirectRunner",
    ]
    assert cache_main.main(argv) == 0
    printed = capsys.readouterr().out
    assert "det_a: already cached" in printed and "det_b: already cached" in printed
    # An incomplete cache is refused with how to clear it.
    os.remove(os.path.join(task_dir(out, "det_b", "train"), "COMPLETED"))
    assert cache_main.main(argv) == 2
    err = capsys.readouterr().err
    assert "incomplete" in err and "--overwrite" in err and "rm -r" in err


def test_arguments():
    args = cache_main.parse_args(
        [
            "--tasks=x",
            "--output_dir=o",
            "--module_import=a,b",
            "--pipeline_options=--runner=FlinkRunner --parallelism=4",
        ]
    )
    assert args.module_import == ["a,b"] and args.split == "train" and not args.overwrite
    assert args.pipeline_options == ["--runner=FlinkRunner --parallelism=4"]
