"""The default experiment with its model_dir and task cache in a bucket (gs://, a fake-gcs-server
this module starts on a free port and kills at the end): `cache_tasks` (Beam, DirectRunner)
writes the cache into the bucket, record for record what the in-process writer puts on local
disk; the standard run "t5_2x2" (tests/fixtures/standard_runs.py: 2 processes x 2 devices) is
trained in the bucket, every process SIGKILLed during a save, resumed, and bit-exact with the
standard run on local disk (`verify`'s comparison across the two model_dirs); no torn object
after the kill; eval and infer reading that model_dir and writing there; the lock refusing a second
run; a missing bucket and an unreachable endpoint as one line, exit 2. The training runs skip
the final evaluation (eval_main is the evaluation under test here).

The bucket run trains on its standard run's layout (2 x 2: their bits are compared); everything
else here (this process's eval, the forked infer and refusals) runs on 2 CPU devices
(`launch_util.devices`), which costs about half the CPU of 8. Every training, eval and infer
process is forked from one interpreter that imported the train program (the `spawner` fixture),
instead of starting a new interpreter each (about 2 s of CPU apiece); Beam's DirectRunner runs one
worker process (a worker process writing into the bucket is the property; a second one would only
import TensorFlow and Beam again)."""

import json
import signal
import socket
import time

import launch_util
import pytest
import standard_runs

from cairn import storage
from cairn.storage.testing import GcsEmulator

devices = launch_util.devices_fixture(2)
STEPS = standard_runs.STEPS
TRAIN = "cairn.launchers.train_main"
# Beam's DirectRunner with one worker process (the default starts two).
ONE_WORKER = "--runner=DirectRunner --direct_num_workers=1 --direct_running_mode=multi_processing"
# The bucket run is the standard run "t5_2x2" with TensorBoard on (its files in the bucket are
# checked): the one config key in which they differ from the archive's run.
TENSORBOARD = "--config.trainer.tensorboard=True"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gcs")
    standard = standard_runs.unpack(tmp)  # the texts, and the reference runs on local disk
    emu = GcsEmulator().start()
    try:
        emu.activate()  # this process reads the bucket too
        bucket = emu.create_bucket("cairn-test")
        env = emu.environ({"CAIRN_SHAKESPEARE_DIR": standard.texts})
        yield {
            "tmp": tmp,
            "standard": standard,
            "emu": emu,
            "bucket": bucket,
            "env": env,
            "local_cache": str(standard.cache),  # the standard runs' (train's in-process writer)
            "gs_cache": bucket + "/cache",
        }
    finally:
        emu.stop()


@pytest.fixture(scope="module")
def spawner(world):
    """One interpreter that imported the train program (on the module's 2 devices, pointed at the
    emulator) forks every training, eval and infer process of the module (`forks.Spawner`)."""
    preload = ("cairn.models", "cairn.trainer", TRAIN)
    with launch_util.Spawner(world["env"], preload=preload) as s:
        yield s


def args(world, model_dir, steps=STEPS, *extra):
    """The standard run's flags (no final evaluation: eval_main is the evaluation under test,
    test_eval_and_infer_...), model_dir and cache in the bucket or on local disk."""
    cache = world["gs_cache"] if str(model_dir).startswith("gs://") else world["local_cache"]
    return standard_runs.overrides(model_dir, cache, steps, extra)


def hashed_config(model_dir) -> dict:
    """`model_dir`'s config.json without the keys the config hash leaves out."""
    from cairn.launchers import config_io

    config = json.loads(storage.read_text(storage.join(str(model_dir), "config.json")))
    for key in config_io.HASH_EXCLUDED:
        *parents, last = key.split(".")
        node = config
        for p in parents:
            node = node.get(p, {})
        node.pop(last, None)
    return config


def compare_with_standard(world, run, tensorboard=False, name="t5"):
    """`verify`'s exact comparison (`compare_runs`, in this process: it reads the bucket too) of
    `run` with the standard run `name` on local disk; with `tensorboard`, their configs differ in
    `trainer.tensorboard` and nothing else (asserted here)."""
    from cairn.launchers import verify

    reference = world["standard"].run(name)
    if tensorboard:
        a, b = hashed_config(reference), hashed_config(run)
        assert (a["trainer"].pop("tensorboard"), b["trainer"].pop("tensorboard")) == (False, True)
        assert a == b
    report = verify.compare_runs(reference, run, allow_config_diff=tensorboard)
    assert report.exit_code == verify.EXIT_IDENTICAL and report.config_differs == tensorboard, report.text()
    assert not report.data_differs and report.last_step == STEPS, report.text()
    assert report.losses_compared == STEPS and report.checksums_compared and report.batches_compared, report.text()
    return report


def test_cache_tasks_with_beam_into_the_bucket(world, capsys, monkeypatch):
    """`cache_main --beam` (a child process, as a user runs it) writes the cache into the bucket;
    the in-process writer (`cache_main.cache`, called here: this process reads the emulator too)
    into the bucket, and on local disk (the standard runs' cache, written by the same writer in
    the train program), give the same records; `verify_cache` (its `_main`, here) re-hashes the
    Beam cache in the bucket: ok."""
    from cairn.datatasks.deterministic import task_dir
    from cairn.datatasks.deterministic.cached_task import CachedTask
    from cairn.launchers import cache_main, config_io, verify_cache_main

    proc = launch_util.run(
        "cairn.launchers.cache_main",
        [
            f"--config={launch_util.T5_CONFIG}",
            "--beam",
            f"--pipeline_options={ONE_WORKER}",
            f"--config.data.cache_dir={world['gs_cache']}",
        ],
        env=world["env"],
        timeout=900,
    )
    assert proc.returncode == 0, launch_util.tail(proc)
    assert f"shakespeare_span_corruption: cached in {world['gs_cache']}" in proc.stdout
    gs_path = task_dir(world["gs_cache"], "shakespeare_span_corruption", "train")
    files = storage.sizes(gs_path)
    assert "COMPLETED" in files and "info.json" in files and any(f.endswith(".array_record") for f in files)
    # The in-process writer, into the bucket and on local disk: the same records everywhere.
    monkeypatch.setenv("CAIRN_SHAKESPEARE_DIR", world["env"]["CAIRN_SHAKESPEARE_DIR"])
    config = config_io.resolve_paths(config_io.load_config_file(launch_util.T5_CONFIG))
    in_process = world["bucket"] + "/cache-in-process"
    config.data.cache_dir = in_process
    assert cache_main.cache(launch_util.spec(config)) == {"shakespeare_span_corruption": "cached"}
    local = CachedTask(task_dir(world["local_cache"], "shakespeare_span_corruption", "train"))
    for path in (gs_path, task_dir(in_process, "shakespeare_span_corruption", "train")):
        remote = CachedTask(path)  # shards read from the bucket by array-record itself
        assert remote.num_records == local.num_records > 10
        assert remote.info["fingerprint"] == local.info["fingerprint"]
        assert remote.read(range(remote.num_records)) == local.read(range(local.num_records))
        assert (remote.lengths == local.lengths).all()
    config.data.cache_dir = world["gs_cache"]
    capsys.readouterr()
    assert verify_cache_main._main(launch_util.spec(config)) == 0
    assert "shakespeare_span_corruption/train: ok" in capsys.readouterr().out


def test_two_processes_on_the_bucket_killed_resumed_match_local_disk(world, spawner):
    """The standard run "t5_2x2" (2 processes x 2 devices) with model_dir and cache in the bucket
    (the cache the previous test wrote; orbax writes from both processes through tensorstore),
    every process SIGKILLed during a background save, resumed: bit-exact with the archive's run
    of that layout on local disk (losses, batch fingerprints, parameter checksums). (2 x 4
    matching 1 x 8 is elastic_resume_test's last stage.)"""
    import pod_runs

    gs_run = world["bucket"] + "/runs/t5-2x2"

    def pod(name):
        return pod_runs.Pod(
            gs_run,
            # --verbose: process 1 logs its saves too (waited for below; by default only process 0 speaks)
            [*args(world, gs_run, STEPS, TENSORBOARD), "--verbose"],
            processes=2,
            devices=2,
            texts=world["env"]["CAIRN_SHAKESPEARE_DIR"],
            log_name=name,
            log_dir=world["tmp"],
            spawner=spawner,  # its interpreter has the module's 2 devices and the emulator's variables
        )

    # When step 8's save starts, step 4's has finished (a save waits for the previous one);
    # step 8's is then being written in the background as the kill lands.
    every = standard_runs.CHECKPOINT_EVERY
    with pod("killed") as killed:
        for i in range(2):
            killed.wait_for(rf"checkpoint at step {2 * every} \(blocked", process=i)
        killed.kill(signal.SIGKILL)
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
    assert f"checkpoints/{every}/commit_success.txt" in files

    with pod("resumed") as resumed:
        resumed.finish()
        assert "taking over the stale lock" in resumed.stderr(0) and "restored step" in resumed.stderr(0)
        assert f"trained to step {STEPS}" in resumed.stdout(0)
    files = storage.file_sizes(gs_run)
    assert "cairn.lock" not in files and f"checkpoints/{STEPS}/commit_success.txt" in files  # released at the end
    assert any(n.startswith("tensorboard/train/events.") for n in files)
    compare_with_standard(world, gs_run, tensorboard=True, name="t5_2x2")
    world["gs_run"] = gs_run


EVAL = ("--config.eval.num_examples=8", "--config.eval.batch_size=4")
INFER = ("--chunk_size=4", "--num_examples=8")


@pytest.fixture(scope="module")
def forked(world, spawner):
    """The programs in processes forked by the module's `spawner` (each its own exit status,
    stdout and stderr), one after the other: infer on the bucket's trained run
    (test_train_on_gs_...), writing there; train on a model_dir whose lock another host holds, on
    a missing bucket and with an unreachable endpoint; eval and infer writing into a missing
    bucket. (eval_main and infer_main define the same flag: each child imports its own.)"""
    gs_run = world.get("gs_run")
    if gs_run is None:
        pytest.fail("needs the trained gs:// run of test_two_processes_on_the_bucket_killed_resumed_match_local_disk")
    run = world["bucket"] + "/runs/locked"
    owner = {"pid": 12345, "host": "another-host"}
    assert storage.create_exclusive(run + "/cairn.lock", json.dumps(owner).encode())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nobody = GcsEmulator.__new__(GcsEmulator)
    nobody.url = f"http://127.0.0.1:{port}"
    common = args(world, gs_run, STEPS, TENSORBOARD, *EVAL)
    predictions = f"{gs_run}/predictions.jsonl"
    procs = []
    for module, argv, env in [
        ("cairn.launchers.infer_main", [*common, f"--output={predictions}", "--chunk_size=4", "--num_examples=8"], {}),
        (TRAIN, args(world, run, 2), {}),
        (TRAIN, args(world, "gs://no-such-bucket/run", 2), {}),
        (TRAIN, args(world, "gs://cairn-test/run", 2), nobody.environ(world["env"])),
        ("cairn.launchers.eval_main", common + ["--eval_dir=gs://no-such-bucket/eval"], {}),
        ("cairn.launchers.infer_main", common + ["--output=gs://no-such-bucket/p.jsonl"], {}),
    ]:
        start = time.monotonic()
        procs.append(spawner.call(module, argv, env=env, timeout=600))
        procs[-1].seconds = time.monotonic() - start
    infer, locked, missing, unreachable, eval_missing, infer_missing = procs
    return {
        "infer": (predictions, infer),
        "locked": (run, locked),
        "missing": missing,
        "unreachable": (port, unreachable),
        "eval_infer_missing": (eval_missing, infer_missing),
    }


def test_eval_and_infer_read_and_write_the_bucket(world, forked, monkeypatch):
    """`eval_main.evaluate` (what the program runs once its flags are parsed, called here: this
    process reads the bucket too) and the infer program (forked) on the bucket's run, both
    writing there."""
    from cairn.launchers import config_base, config_io, eval_main

    gs_run = world["gs_run"]
    monkeypatch.setenv("CAIRN_SHAKESPEARE_DIR", world["env"]["CAIRN_SHAKESPEARE_DIR"])
    local = world["tmp"] / "config.json"  # the run's config.json, as eval would load it with --config
    local.write_text(storage.read_text(gs_run + "/config.json"))
    config = config_io.resolve_paths(config_io.load_saved_config(str(local)))
    config.eval.num_examples, config.eval.batch_size = 8, 4  # EVAL
    # The run trained as 2 processes (its config.json names the job); this eval is one process.
    config.multihost = config_base.base_config().multihost
    assert config.model_dir == gs_run and config.data.cache_dir == world["gs_cache"]
    printed = []
    assert list(eval_main.evaluate(launch_util.spec(config), gs_run, STEPS, out=printed.append)) == [STEPS], printed
    done, bad = storage.read_json_lines(f"{gs_run}/eval/validation/evaluated.jsonl")
    assert [r["step"] for r in done] == [STEPS] and bad == 0
    assert storage.read_json_lines(f"{gs_run}/eval/validation/metrics.jsonl")[0]

    out, proc = forked["infer"]
    assert proc.returncode == 0, launch_util.tail(proc)
    rows = [json.loads(line) for line in storage.read_text(out).splitlines()]
    assert [r["index"] for r in rows] == list(range(8))
    assert sorted(storage.sizes(out + ".parts")) == ["meta.json", "part-00000.jsonl", "part-00001.jsonl"]


def test_the_lock_refuses_a_second_run(forked):
    run, proc = forked["locked"]
    assert proc.returncode == 2, launch_util.tail(proc)
    lines = proc.stderr.strip().splitlines()
    assert "in use by pid 12345 on host another-host" in lines[-1]
    assert sorted(storage.file_sizes(run)) == ["cairn.lock"]  # nothing written, nothing lost


def test_a_missing_bucket_is_one_line(forked):
    proc = forked["missing"]
    assert proc.returncode == 2, launch_util.tail(proc)
    last = proc.stderr.strip().splitlines()[-1]
    assert "gs://no-such-bucket/run" in last and "bucket 'no-such-bucket' does not exist" in last
    assert "Traceback" not in proc.stderr


def test_an_unreachable_endpoint_is_one_line(forked):
    port, proc = forked["unreachable"]
    assert proc.returncode == 2, launch_util.tail(proc)
    last = proc.stderr.strip().splitlines()[-1]
    assert f"cannot reach the storage endpoint http://127.0.0.1:{port}" in last and "gs://cairn-test/run" in last
    assert proc.seconds < 240


def test_eval_and_infer_into_a_missing_bucket_are_one_line(forked):
    for proc, key in zip(forked["eval_infer_missing"], ("eval_dir", "output"), strict=True):
        assert proc.returncode == 2, launch_util.tail(proc)
        last = proc.stderr.strip().splitlines()[-1]
        assert f"config key '{key}'" in last and "bucket 'no-such-bucket' does not exist" in last, last
