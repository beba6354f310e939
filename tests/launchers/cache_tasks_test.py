"""`//launchers:cache_tasks`: the config's training tasks cached by the entry point, in-process
and with Apache Beam give the same records; a complete cache is left alone and one of an older
format re-cached; the entry point exits 0; `//launchers:verify_cache` passes the cache, then
names a shard with a flipped byte (exit 2); both programs also take registered tasks
(`--tasks=REGEX --module_import=MODULE` with `--output_dir` / `--cache_dir`, no config), and
refuse `--config` with `--tasks`, or neither, in one line. The programs run as processes forked from one
interpreter that imported TensorFlow and the data libraries (`launch_util.Spawner`): each its
own exit status and output. One cache of the task is written by the entry point and reused by
the in-process checks (the first in-process cache was a second cache of the same records)."""

import json
import os
import pathlib

import launch_util


def test_in_process_and_beam_caches_agree(tmp_path, monkeypatch, capfd):
    from cairn.datatasks.deterministic import task_dir
    from cairn.datatasks.deterministic.cached_task import CachedTask
    from cairn.launchers import cache_main, config_io

    texts = launch_util.small_texts(tmp_path)
    monkeypatch.setenv("CAIRN_SHAKESPEARE_DIR", texts)
    env = {"CAIRN_SHAKESPEARE_DIR": texts}
    args = [f"--config={launch_util.LM_CONFIG}", f"--config.data.cache_dir={tmp_path / 'a'}"]
    preload = ("cairn.launchers.quiet_startup", "tensorflow", "cairn.datatasks.deterministic", "cairn.launchers.data")
    with launch_util.Spawner(preload=preload) as programs:
        proc = programs.call("cairn.launchers.cache_main", args, env=env)
        assert proc.returncode == 0, launch_util.tail(proc)
        assert f"shakespeare_lm: cached in {tmp_path / 'a'}" in proc.stdout
        path = task_dir(str(tmp_path / "a"), "shakespeare_lm", "train")
        assert os.path.exists(os.path.join(path, "COMPLETED"))

        config = config_io.resolve_paths(config_io.load_config_file(launch_util.LM_CONFIG))
        config.data.cache_dir = str(tmp_path / "a")
        assert cache_main.cache(launch_util.spec(config)) == {"shakespeare_lm": "already cached"}
        # A cache of the older format 2 is re-cached in-process (as the train launcher does), with a notice.
        pathlib.Path(path, "COMPLETED").write_text(json.dumps({"format_version": 2}) + "\n")
        capfd.readouterr()
        assert cache_main.cache(launch_util.spec(config)) == {"shakespeare_lm": "cached"}
        assert f"cairn: re-caching {path}: it was written in cache format 2" in capfd.readouterr().err
        # A local cache of format 3 (no chunk index) is upgraded in place, not re-cached.
        chunks = pathlib.Path(path, "chunks.npy").read_bytes()
        info = json.loads(pathlib.Path(path, "info.json").read_text())
        del info["chunks"]
        pathlib.Path(path, "info.json").write_text(json.dumps(dict(info, format_version=3)))
        os.remove(os.path.join(path, "chunks.npy"))
        pathlib.Path(path, "COMPLETED").write_text(json.dumps({"format_version": 3}) + "\n")
        assert cache_main.cache(launch_util.spec(config)) == {"shakespeare_lm": "upgraded"}
        assert f"cairn: upgraded {path} from cache format 3 to 4 in place" in capfd.readouterr().err
        assert pathlib.Path(path, "chunks.npy").read_bytes() == chunks
        a = CachedTask(path)
        config.data.cache_dir = str(tmp_path / "b")
        assert cache_main.cache(launch_util.spec(config), beam=True) == {"shakespeare_lm": "cached"}
        b = CachedTask(task_dir(str(tmp_path / "b"), "shakespeare_lm", "train"))
        assert a.num_records == b.num_records > 10
        assert a.info["fingerprint"] == b.info["fingerprint"]
        assert a.read(range(a.num_records)) == b.read(range(b.num_records))

        # //launchers:verify_cache: all shards match, then one byte flipped (same size) is named.
        proc = programs.call("cairn.launchers.verify_cache_main", args, env=env)
        assert proc.returncode == 0, launch_util.tail(proc)
        assert "shakespeare_lm/train: ok" in proc.stdout
        shard = sorted(p for p in os.listdir(path) if p.endswith(".array_record"))[0]
        data = bytearray(pathlib.Path(path, shard).read_bytes())
        data[len(data) // 2] ^= 0xFF
        pathlib.Path(path, shard).write_bytes(bytes(data))
        proc = programs.call("cairn.launchers.verify_cache_main", args, env=env)
        assert proc.returncode == 2, launch_util.tail(proc)
        assert shard in proc.stdout + proc.stderr and "Traceback" not in proc.stderr


TASKS_MODULE = """
import os
import cairn.datatasks as dt
from cairn.datatasks import preprocessors as pp
from cairn.tokenizers import ByteVocabulary

vocab = ByteVocabulary()


def as_targets(ds):
    return ds.map(lambda line: {"targets": line})


for name in ("lines_a", "lines_b"):
    dt.DEFAULT_REGISTRY.add_task(dt.Task(
        name,
        dt.TextLineDataSource({"train": os.path.join(os.path.dirname(__file__), name + ".txt")}),
        {"targets": dt.Feature(vocab)},
        [as_targets, pp.tokenize, pp.append_eos_after_trim],
    ))
"""


def test_registered_tasks_without_a_config(tmp_path):
    """`--tasks` (seqio's cache_tasks_main arguments): the module's tasks cached under
    `--output_dir` in this process, then verified under `--cache_dir`; a changed source is named."""
    (tmp_path / "cli_tasks.py").write_text(TASKS_MODULE)
    for name in ("lines_a", "lines_b"):
        (tmp_path / f"{name}.txt").write_text("".join(f"{name} line {i}\n" for i in range(40)))
    env = {"BUILD_WORKING_DIRECTORY": str(tmp_path)}  # where `bazel run` was typed: --module_import's root
    out = tmp_path / "cache"
    tasks = ["--tasks=lines_.*", "--module_import=cli_tasks"]
    preload = ("cairn.launchers.quiet_startup", "tensorflow", "cairn.datatasks.deterministic", "cairn.launchers.data")
    with launch_util.Spawner(preload=preload) as programs:
        proc = programs.call("cairn.launchers.cache_main", [*tasks, f"--output_dir={out}"], env=env)
        assert proc.returncode == 0, launch_util.tail(proc)
        assert proc.stdout.splitlines() == [f"lines_a: cached in {out}", f"lines_b: cached in {out}"]
        proc = programs.call("cairn.launchers.verify_cache_main", [*tasks, f"--cache_dir={out}"], env=env)
        assert proc.returncode == 0, launch_util.tail(proc)
        assert proc.stdout.splitlines() == ["lines_a/train: ok", "lines_b/train: ok"]
        (tmp_path / "lines_b.txt").write_text("changed\n")
        proc = programs.call("cairn.launchers.verify_cache_main", [*tasks, f"--cache_dir={out}"], env=env)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert proc.stdout.splitlines()[0] == "lines_a/train: ok"
        assert proc.stdout.splitlines()[1].startswith("lines_b/train: source file 'lines_b.txt'")
        # Bad combinations and a missing directory: one line each, exit 2.
        for argv, message in (
            ([*tasks, f"--output_dir={out}", f"--config={launch_util.LM_CONFIG}"], "not both"),
            ([f"--output_dir={out}"], "--tasks=REGEX --module_import=MODULE (registered tasks) is required"),
            (tasks, "--tasks needs --output_dir=DIR"),
            (["--tasks=lines_.*", "--module_import=no_such_module", f"--output_dir={out}"], "cannot import"),
            (["--tasks=nothing_.*", "--module_import=cli_tasks", f"--output_dir={out}"], "matches no registered task"),
        ):
            proc = programs.call("cairn.launchers.cache_main", argv, env=env)
            errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
            assert proc.returncode == 2 and "Traceback" not in proc.stderr, launch_util.tail(proc)
            assert len(errors) == 1 and message in errors[0], launch_util.tail(proc)
