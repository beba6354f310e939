"""`//launchers:cache_tasks`: the config's training tasks cached in-process and with Apache
Beam give the same records; a complete cache is left alone; the entry point exits 0. The
programs run as processes forked from one interpreter that imported TensorFlow and the data
libraries (`launch_util.Spawner`): each its own exit status and output."""

import os

import launch_util


def test_in_process_and_beam_caches_agree(tmp_path, monkeypatch, capfd):
    import json
    import pathlib

    from cairn.datatasks.deterministic import task_dir
    from cairn.datatasks.deterministic.cached_task import CachedTask
    from cairn.launchers import cache_main, config_io

    monkeypatch.setenv("CAIRN_SHAKESPEARE_DIR", launch_util.small_texts(tmp_path))
    config = config_io.resolve_paths(config_io.load_config_file(launch_util.LM_CONFIG))
    config.data.cache_dir = str(tmp_path / "a")
    assert cache_main.cache(config) == {"shakespeare_lm": "cached"}
    assert cache_main.cache(config) == {"shakespeare_lm": "already cached"}
    # A cache of the older format 2 is re-cached (as the train launcher does), with a notice.
    path = task_dir(str(tmp_path / "a"), "shakespeare_lm", "train")
    pathlib.Path(path, "COMPLETED").write_text(json.dumps({"format_version": 2}) + "\n")
    capfd.readouterr()
    assert cache_main.cache(config) == {"shakespeare_lm": "cached"}
    assert f"cairn: re-caching {path}: it was written in cache format 2" in capfd.readouterr().err
    a = CachedTask(task_dir(str(tmp_path / "a"), "shakespeare_lm", "train"))
    config.data.cache_dir = str(tmp_path / "b")
    assert cache_main.cache(config, beam=True) == {"shakespeare_lm": "cached"}
    b = CachedTask(task_dir(str(tmp_path / "b"), "shakespeare_lm", "train"))
    assert a.num_records == b.num_records > 10
    assert a.info["fingerprint"] == b.info["fingerprint"]
    assert a.read(range(a.num_records)) == b.read(range(b.num_records))


def test_entry_point(tmp_path):
    env = {"CAIRN_SHAKESPEARE_DIR": launch_util.small_texts(tmp_path)}
    preload = ("cairn.launchers.startup", "tensorflow", "cairn.datatasks.deterministic", "cairn.launchers.data")
    with launch_util.Spawner(preload=preload) as programs:
        _entry_points(programs.call, tmp_path, env)


def _entry_points(run, tmp_path, env):
    proc = run(
        "cairn.launchers.cache_main",
        [f"--config={launch_util.T5_CONFIG}", f"--config.data.cache_dir={tmp_path / 'c'}"],
        env=env,
    )
    assert proc.returncode == 0, launch_util.tail(proc)
    assert f"shakespeare_span_corruption: cached in {tmp_path / 'c'}" in proc.stdout
    assert os.path.exists(tmp_path / "c" / "shakespeare_span_corruption" / "train" / "COMPLETED")
    # //launchers:verify_cache: all shards match, then one byte flipped (same size) is named.
    args = [f"--config={launch_util.T5_CONFIG}", f"--config.data.cache_dir={tmp_path / 'c'}"]
    proc = run("cairn.launchers.verify_cache_main", args, env=env)
    assert proc.returncode == 0, launch_util.tail(proc)
    assert "shakespeare_span_corruption/train: ok" in proc.stdout
    split_dir = tmp_path / "c" / "shakespeare_span_corruption" / "train"
    shard = sorted(p for p in os.listdir(split_dir) if p.endswith(".array_record"))[0]
    data = bytearray((split_dir / shard).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (split_dir / shard).write_bytes(bytes(data))
    proc = run("cairn.launchers.verify_cache_main", args, env=env)
    assert proc.returncode == 2, launch_util.tail(proc)
    assert shard in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
