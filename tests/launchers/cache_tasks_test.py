"""`//launchers:cache_tasks`: the config's training tasks cached by the entry point, in-process
and with Apache Beam give the same records; a complete cache is left alone and one of an older
format re-cached; the entry point exits 0; `//launchers:verify_cache` passes the cache, then
names a shard with a flipped byte (exit 2). The programs run as processes forked from one
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
    preload = ("cairn.launchers.startup", "tensorflow", "cairn.datatasks.deterministic", "cairn.launchers.data")
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
