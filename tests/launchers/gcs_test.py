"""The default experiment with its model_dir and task cache in a bucket (gs://, a
fake-gcs-server this module starts on a free port and kills at the end): `cache_tasks` (Beam,
DirectRunner) writes the cache into the bucket, record for record what the in-process writer
puts on local disk; the run is trained, SIGKILLed after a checkpoint, resumed, and bit-exact
with the same run on local disk (`verify` across the two model_dirs); 2 processes on the bucket
match 1 on local disk; no torn object after the kill; eval and infer reading that model_dir and writing
there; the lock refusing a second run;
a missing bucket and an unreachable endpoint as one line, exit 2. The training runs skip the final
evaluation (eval_main is the evaluation under test here)."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import launch_util
import pytest

from cairn import storage
from cairn.storage.testing import GcsEmulator

STEPS = 8


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gcs")
    emu = GcsEmulator().start()
    try:
        emu.activate()  # this process reads the bucket too
        bucket = emu.create_bucket("cairn-test")
        env = emu.environ({"CAIRN_SHAKESPEARE_DIR": launch_util.small_texts(tmp)})
        yield {
            "tmp": tmp,
            "emu": emu,
            "bucket": bucket,
            "env": env,
            "local_cache": str(tmp / "cache"),
            "gs_cache": bucket + "/cache",
        }
    finally:
        emu.stop()


def args(world, model_dir, steps=STEPS, *extra):
    cache = world["gs_cache"] if str(model_dir).startswith("gs://") else world["local_cache"]
    return [
        f"--config={launch_util.T5_CONFIG}",
        f"--config.model_dir={model_dir}",
        f"--config.data.cache_dir={cache}",
        f"--config.num_train_steps={steps}",
        "--config.data.batch_size=8",
        "--config.eval.num_examples=8",
        "--config.eval.batch_size=4",
        "--config.trainer.log_every=1",
        "--config.trainer.checkpoint_every=2",
        "--config.fingerprint_every=2",
        # No final evaluation: eval_main is the evaluation under test (test_eval_and_infer_...).
        "--config.post_training.final_eval=false",
        "--config.post_training.num_samples=0",
        *extra,
    ]


def child_env(env):
    full = dict(os.environ)
    full.update(env)
    full.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    full.setdefault("JAX_PLATFORMS", "cpu")
    full.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return full


def train_until_killed(world, model_dir, pattern, timeout=400):
    """Starts a run, SIGKILLs its process group once `pattern` is in its stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cairn.launchers.train_main"] + args(world, model_dir),
        env=child_env(world["env"]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(launch_util.REPO),
        start_new_session=True,
    )
    seen, lines = threading.Event(), []

    def read():
        for line in proc.stderr:
            lines.append(line)
            if pattern in line:
                seen.set()
        seen.set()  # the run ended without it: the assertion below says why

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.wait(timeout) and proc.poll() is None, "".join(lines[-40:])
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(timeout=10)
    return "".join(lines)


def test_cache_tasks_with_beam_into_the_bucket(world, capsys, monkeypatch):
    """`cache_main --beam` (a child process, as a user runs it) writes the cache into the bucket;
    the in-process writer (`cache_main.cache`, called here: this process reads the emulator too)
    on local disk and into the bucket gives the same records; `verify_cache` (its `_main`, here)
    re-hashes the Beam cache in the bucket: ok."""
    from cairn.datatasks.deterministic import task_dir
    from cairn.datatasks.deterministic.store import CachedTask
    from cairn.launchers import cache_main, config_io, verify_cache_main

    proc = launch_util.run(
        "cairn.launchers.cache_main",
        [f"--config={launch_util.T5_CONFIG}", "--beam", f"--config.data.cache_dir={world['gs_cache']}"],
        env=world["env"],
        timeout=900,
    )
    assert proc.returncode == 0, launch_util.tail(proc)
    assert f"shakespeare_span_corruption: cached in {world['gs_cache']}" in proc.stdout
    gs_path = task_dir(world["gs_cache"], "shakespeare_span_corruption", "train")
    files = storage.sizes(gs_path)
    assert "COMPLETED" in files and "info.json" in files and any(f.endswith(".array_record") for f in files)
    # The in-process writer, on local disk and into the bucket: the same records everywhere.
    monkeypatch.setenv("CAIRN_SHAKESPEARE_DIR", world["env"]["CAIRN_SHAKESPEARE_DIR"])
    config = config_io.resolve_paths(config_io.load_config_file(launch_util.T5_CONFIG))
    in_process = world["bucket"] + "/cache-in-process"
    for cache_dir in (world["local_cache"], in_process):
        config.data.cache_dir = cache_dir
        assert cache_main.cache(config) == {"shakespeare_span_corruption": "cached"}
    local = CachedTask(task_dir(world["local_cache"], "shakespeare_span_corruption", "train"))
    for path in (gs_path, task_dir(in_process, "shakespeare_span_corruption", "train")):
        remote = CachedTask(path)  # shards read from the bucket by array-record itself
        assert remote.num_records == local.num_records > 10
        assert remote.info["fingerprint"] == local.info["fingerprint"]
        assert remote.read(range(remote.num_records)) == local.read(range(local.num_records))
        assert (remote.lengths == local.lengths).all()
    config.data.cache_dir = world["gs_cache"]
    capsys.readouterr()
    assert verify_cache_main._main(config) == 0
    assert "shakespeare_span_corruption/train: ok" in capsys.readouterr().out


def test_train_on_gs_killed_resumed_matches_local_disk(world):
    local = world["tmp"] / "local"
    proc = launch_util.train(args(world, local), env=world["env"], timeout=600)
    assert proc.returncode == 0, launch_util.tail(proc)
    # Both caches exist (the previous test, or the in-process writer here): the runs only train.
    gs_run = world["bucket"] + "/runs/t5"
    # When step 6's save starts, step 4's has finished (a save waits for the previous one);
    # step 6's is then being written in the background as the kill lands.
    train_until_killed(world, gs_run, "checkpoint at step 6 (blocked")
    files = storage.file_sizes(gs_run)
    assert "config.json" in files and "cairn.lock" in files  # the kill left the lock
    # Nothing torn: every object that is there parses whole.
    json.loads(storage.read_text(gs_run + "/config.json"))
    json.loads(storage.read_text(gs_run + "/fingerprint/header.json"))
    parts = [n for n in files if ".jsonl.parts/" in n]
    assert any(n.startswith("summaries/metrics.jsonl.parts/") for n in parts)
    for name in parts:
        for line in storage.read_text(f"{gs_run}/{name}").splitlines():
            json.loads(line)
    assert "checkpoints/4/commit_success.txt" in files

    proc = launch_util.train(args(world, gs_run), env=world["env"], timeout=600)
    assert proc.returncode == 0, launch_util.tail(proc)
    assert "taking over the stale lock" in proc.stderr and "restored step" in proc.stderr
    assert f"trained to step {STEPS}" in proc.stdout
    assert "cairn.lock" not in storage.file_sizes(gs_run)  # released at the end
    assert any(n.startswith("tensorboard/train/events.") for n in storage.file_sizes(gs_run))
    verify = launch_util.run(
        "cairn.launchers.verify", [f"--run_a={local}", f"--run_b={gs_run}"], env=world["env"], timeout=300
    )
    assert verify.returncode == 0, launch_util.tail(verify)
    assert "bitwise" in verify.stdout or "identical" in verify.stdout, verify.stdout
    world["gs_run"] = gs_run


def test_two_processes_on_the_bucket_match_one(world):
    """2 processes x 4 devices, model_dir and cache in the bucket (orbax writes from both
    processes through tensorstore): the same run as 1 process x 8 on local disk, with the
    tolerance of the pod layout tests (identical batch fingerprints; losses and parameter sums
    within rtol 1e-5: gloo sums the processes' partial gradients in another order)."""
    import pod_runs

    if "gs_run" not in world:
        pytest.fail("needs the local run of test_train_on_gs_killed_resumed_matches_local_disk")
    run = world["bucket"] + "/runs/t5-2x4"
    pod = pod_runs.Pod(
        run,
        args(world, run),
        processes=2,
        devices=4,
        texts=world["env"]["CAIRN_SHAKESPEARE_DIR"],
        log_name="t5-2x4",
        log_dir=world["tmp"],
    )
    with pod:
        pod.finish()
    assert "checkpoints/8/commit_success.txt" in storage.file_sizes(run)
    verify = launch_util.run(
        "cairn.launchers.verify",
        [f"--run_a={world['tmp'] / 'local'}", f"--run_b={run}", "--rtol=1e-5"],
        env=world["env"],
        timeout=300,
    )
    assert verify.returncode == 0, launch_util.tail(verify)


def test_eval_and_infer_read_and_write_the_bucket(world):
    gs_run = world.get("gs_run")
    if gs_run is None:
        pytest.fail("needs the trained gs:// run of the previous test")
    common = args(world, gs_run)
    proc = launch_util.run("cairn.launchers.eval_main", common + [f"--step={STEPS}"], env=world["env"], timeout=600)
    assert proc.returncode == 0, launch_util.tail(proc)
    done, bad = storage.read_json_lines(f"{gs_run}/eval/validation/evaluated.jsonl")
    assert [r["step"] for r in done] == [STEPS] and bad == 0
    assert storage.read_json_lines(f"{gs_run}/eval/validation/metrics.jsonl")[0]
    out = f"{gs_run}/predictions.jsonl"
    proc = launch_util.run(
        "cairn.launchers.infer_main",
        common + [f"--output={out}", "--chunk_size=4", "--num_examples=8"],
        env=world["env"],
        timeout=600,
    )
    assert proc.returncode == 0, launch_util.tail(proc)
    rows = [json.loads(line) for line in storage.read_text(out).splitlines()]
    assert [r["index"] for r in rows] == list(range(8))
    assert sorted(storage.sizes(out + ".parts")) == ["meta.json", "part-00000.jsonl", "part-00001.jsonl"]


@pytest.fixture(scope="module")
def refused(world):
    """The train program on a model_dir whose lock another host holds, and on a missing bucket:
    each run in its own process forked from one interpreter that imported it
    (`launch_util.run_forked`)."""
    run = world["bucket"] + "/runs/locked"
    owner = {"pid": 12345, "host": "another-host"}
    assert storage.create_exclusive(run + "/cairn.lock", json.dumps(owner).encode())
    locked, missing = launch_util.run_forked(
        "cairn.launchers.train_main",
        [args(world, run, 2), args(world, "gs://no-such-bucket/run", 2)],
        env=world["env"],
        timeout=300,
        preload=("cairn.models", "cairn.trainer"),
    )
    return {"locked": (run, locked), "missing": missing}


def test_the_lock_refuses_a_second_run(refused):
    run, proc = refused["locked"]
    assert proc.returncode == 2, launch_util.tail(proc)
    lines = proc.stderr.strip().splitlines()
    assert "in use by pid 12345 on host another-host" in lines[-1]
    assert sorted(storage.file_sizes(run)) == ["cairn.lock"]  # nothing written, nothing lost


def test_a_missing_bucket_is_one_line(refused):
    proc = refused["missing"]
    assert proc.returncode == 2, launch_util.tail(proc)
    last = proc.stderr.strip().splitlines()[-1]
    assert "gs://no-such-bucket/run" in last and "bucket 'no-such-bucket' does not exist" in last
    assert "Traceback" not in proc.stderr


def test_an_unreachable_endpoint_is_one_line(world):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = GcsEmulator.__new__(GcsEmulator)
    env.url = f"http://127.0.0.1:{port}"
    start = time.monotonic()
    proc = launch_util.train(args(world, "gs://cairn-test/run", 2), env=env.environ(world["env"]), timeout=300)
    assert proc.returncode == 2, launch_util.tail(proc)
    last = proc.stderr.strip().splitlines()[-1]
    assert f"cannot reach the storage endpoint http://127.0.0.1:{port}" in last and "gs://cairn-test/run" in last
    assert time.monotonic() - start < 240


def test_eval_and_infer_into_a_missing_bucket_are_one_line(world):
    common = args(world, world["bucket"] + "/runs/t5")
    for module, extra, key in (
        ("cairn.launchers.eval_main", ["--eval_dir=gs://no-such-bucket/eval"], "eval_dir"),
        ("cairn.launchers.infer_main", ["--output=gs://no-such-bucket/p.jsonl"], "output"),
    ):
        proc = launch_util.run(module, common + extra, env=world["env"], timeout=300)
        assert proc.returncode == 2, launch_util.tail(proc)
        last = proc.stderr.strip().splitlines()[-1]
        assert f"config key '{key}'" in last and "bucket 'no-such-bucket' does not exist" in last, last
