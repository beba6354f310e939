"""tools/ci/test_times.py: per-target wall time, CPU time and process counts from Bazel's test.xml
files, and pytest_main's process log (the children a test starts, counted into its test.xml)."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).absolute().parent.parent


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


test_times = _load("test_times", ROOT / "tools" / "ci" / "test_times.py")


def _xml(path, wall=None, procs=None, train=None, tests=3, suite_time=1.5, cpu=None, tf=None):
    props = ""
    if wall is not None:
        extra = (
            ""
            if cpu is None
            else (f'<property name="cpu_s" value="{cpu}" /><property name="tensorflow_processes" value="{tf}" />')
        )
        props = (
            f'<properties><property name="wall_s" value="{wall}" /><property name="processes" value="{procs}" />'
            f'<property name="train_processes" value="{train}" />{extra}</properties>'
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="{tests}" time="{suite_time}">'
        f"{props}</testsuite></testsuites>"
    )


def test_targets_ranked_and_totalled(tmp_path, capsys):
    _xml(tmp_path / "tests" / "a" / "slow_test" / "test.xml", wall=90.5, procs=6, train=4, cpu=150.25, tf=2)
    _xml(tmp_path / "tests" / "a" / "fast_test" / "test.xml", wall=2.0, procs=0, train=0, cpu=1.5, tf=0)
    _xml(tmp_path / "tests" / "old_test" / "test.xml", suite_time=7.5)  # no properties: pytest's time
    out_json = tmp_path / "times.json"
    assert test_times.main([str(tmp_path), "--top", "2", "--json", str(out_json)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["//tests/a:slow_test", "90.5", "3", "6", "4", "150.2", "2"]
    assert lines[2].split() == ["//tests:old_test", "7.5", "3", "-", "-", "-", "-"]
    assert len(lines) == 4  # header, the 2 slowest, the total
    assert lines[3].split() == ["total", "(3", "targets)", "100.0", "9", "6", "4", "151.8", "2"]
    rows = json.loads(out_json.read_text())
    assert [r["label"] for r in rows] == ["//tests/a:fast_test", "//tests/a:slow_test", "//tests:old_test"]


def test_only_the_targets_of_a_log_and_cached_ones_marked(tmp_path, capsys):
    _xml(tmp_path / "t" / "x_test" / "test.xml", wall=10, procs=1, train=1)
    _xml(tmp_path / "t" / "y_test" / "test.xml", wall=20, procs=2, train=0)
    _xml(tmp_path / "t" / "gone_test" / "test.xml", wall=500, procs=0, train=0)
    log = tmp_path / "bazel.log"
    log.write_text(
        "INFO: Build completed\n"
        "//t:x_test                                  PASSED in 10.0s\n"
        "//t:y_test                         (cached) PASSED in 20.0s\n"
    )
    assert test_times.main([str(tmp_path), "--log", str(log)]) == 0
    out = capsys.readouterr().out
    assert "gone_test" not in out
    assert "cached" in next(line for line in out.splitlines() if "y_test" in line)
    assert "run now (1 targets)" in out and "total (2 targets)" in out


def test_missing_logs_are_an_error(tmp_path, capsys):
    assert test_times.main([str(tmp_path / "absent")]) == 2
    assert "no test logs" in capsys.readouterr().err


def test_children_are_logged_and_training_runs_told_apart(tmp_path):
    """The sitecustomize that pytest_main puts on children's PYTHONPATH logs each interpreter."""
    folder = ROOT / "tools" / "testing" / "process_log"
    log = tmp_path / "processes.jsonl"
    env = dict(os.environ, PYTHONPATH=str(folder), CAIRN_TEST_PROCESS_LOG=str(log))
    for code in ("pass", "import sys"):
        subprocess.run([sys.executable, "-c", code, "train_worker.py"], env=env, check=True, timeout=60)
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True, timeout=60)
    # A process that imports TensorFlow says so at exit (a stand-in module: the real one takes 4 s).
    fake = tmp_path / "fake"
    (fake / "tensorflow").mkdir(parents=True)
    (fake / "tensorflow" / "__init__.py").write_text("")
    tf_env = dict(env, PYTHONPATH=os.pathsep.join([str(folder), str(fake)]))
    subprocess.run([sys.executable, "-c", "import tensorflow"], env=tf_env, check=True, timeout=60)
    # One killed before exiting is counted as started, not as a TensorFlow process.
    subprocess.run([sys.executable, "-c", "import os, tensorflow; os._exit(0)"], env=tf_env, check=True, timeout=60)
    main = _load("pytest_main_under_test", ROOT / "tools" / "testing" / "pytest_main.py")
    assert main._count_processes(str(log)) == (5, 2, 1)
    assert main._count_processes(str(tmp_path / "none.jsonl")) == (0, 0, 0)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    exits = [r for r in records if r.get("exit")]
    assert len(exits) == 4 and all(r["cpu_s"] >= 0 for r in exits)


def test_children_start_with_the_tests_xla_and_tensorflow_settings_unless_switched_off():
    """`CAIRN_TEST_FAST=1`: the sitecustomize adds the tests' XLA options a child's `XLA_FLAGS`
    lacks (keeping its own, e.g. its device count) and `TF_USE_LEGACY_KERAS=1`; `0`: neither."""
    folder = ROOT / "tools" / "testing" / "process_log"
    probe = "import os; print(os.environ.get('XLA_FLAGS')); print(os.environ.get('TF_USE_LEGACY_KERAS'))"
    base = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "CAIRN_TEST_PROCESS_LOG")}
    flags = "--xla_force_host_platform_device_count=3 --xla_backend_optimization_level=0"
    out = {}
    for fast in ("1", "0"):
        env = dict(base, PYTHONPATH=str(folder), CAIRN_TEST_FAST=fast, XLA_FLAGS=flags)
        proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
        out[fast] = proc.stdout.splitlines()
    added = (
        " --xla_llvm_disable_expensive_passes=true --xla_cpu_use_fusion_emitters=false"
        " --xla_cpu_parallel_codegen_split_count=1"
    )
    assert out["1"] == [flags + added, "1"]
    assert out["0"] == [flags, "None"]


def test_the_costliest_children_from_the_targets_process_logs(tmp_path, capsys):
    import zipfile

    _xml(tmp_path / "t" / "x_test" / "test.xml", wall=10, procs=3, train=1, cpu=30, tf=1)
    records = [
        {"pid": 1, "argv": ["python", "-m", "cairn.launchers.train_main", "--config=/a/b/exp.py"]},
        {"pid": 2, "argv": ["python", "-c", "pass"]},
        {"pid": 3, "argv": ["python", "-m", "cairn.launchers.eval_main"]},  # killed: no exit line
        {"pid": 2, "exit": True, "tensorflow": False, "cpu_s": 0.5},
        {"pid": 1, "exit": True, "tensorflow": True, "cpu_s": 12.25},
    ]
    outputs = tmp_path / "t" / "x_test" / "test.outputs"
    outputs.mkdir(parents=True)
    with zipfile.ZipFile(outputs / "outputs.zip", "w") as z:
        z.writestr("processes.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    assert test_times.main([str(tmp_path), "--children", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    first = lines.index(next(line for line in lines if line.strip().startswith("cpu s")))
    assert lines[first + 1].split() == [
        "12.2",
        "y",
        "//t:x_test",
        "-m",
        "cairn.launchers.train_main",
        "--config=exp.py",
    ]
    assert lines[first + 2].split()[:3] == ["0.5", "-", "//t:x_test"]
    assert lines[first + 3] == "3 child processes, 2 exited normally: 12.8 s of CPU, 1 imported TensorFlow"
