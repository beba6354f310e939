"""The fault matrix (issue 35) at its smallest: each fault met by the train program, from a copy of
the standard checkpointed run (tests/fixtures/standard_runs.py, "t5_checkpoints": 6 steps, a
checkpoint at 2, 4 and 6) rather than a run trained here. Per fault: the exit status, the lines
it prints beyond a normal run's (the model_dir line, cairn's INFO lines and the progress line),
and the model_dir invariants: the last good checkpoint intact (its files match its manifest),
nothing half-written (no orbax temporary folder), one history (one metrics row per step and
metric), and for a refusal every byte of model_dir as it was.

- a full disk: a tmpfs mounted on model_dir in a user namespace of the child (its checkpoints
  copied in, a few MiB to spare; the model_dir copied out at exit), or, where namespaces are
  not allowed, an injected ENOSPC;
- a file too large: the child's `RLIMIT_FSIZE` (`ulimit -f`) at 2 MiB;
- a fallback: step 6 corrupt, the run resumes from 4 (one history: the rows of steps 5-6 aside);
- a SIGKILL after a checkpoint commits and before the next log step (step 8 committed, killed at
  step 9, `log_every` 5): resumed, the run has one row per (step, metric) for every step and
  `verify` (which fails on a missing step) finds it bit-exact with an uninterrupted run;
- refusals: every checkpoint corrupt, a held lock, a changed config, a mesh that does not fit;
- 2 processes x 2 devices: process 0 (the coordinator) killed, process 1 under
  `cairn.launchers.supervise` (exit 3, one line naming process 0 and its address); process 1 (a
  peer) killed, process 0 stops within `multihost.heartbeat_timeout_seconds` (exit 3, one line),
  releasing the model_dir lock; in both, every step up to the last checkpoint has its rows.

The settings are the users': `trainer.log_every` the experiment's 5, `trainer.checkpoint_every` the
checkpointed run's 2 (its config.json), `multihost.heartbeat_timeout_seconds` the default.

Every run is forked from one interpreter that imported the train program, except the
supervised one (a fresh interpreter under the supervisor, as on a pod)."""

import collections
import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import sys
import textwrap
import time

import launch_util
import pytest
import standard_runs as sr
from forks import Spawner

from cairn.launchers.schema import Multihost

DEVICES = 2
TRAIN = "cairn.launchers.train_main"
BOUND_S = Multihost().heartbeat_timeout_seconds  # the default, as users get it
SPARE = 4 << 20  # free bytes on the disk-full row's tmpfs beyond what model_dir holds
# Lines of a normal run on stderr: cairn's INFO logs, the progress line (on a pipe); and the
# warning that the run continues with another config (the matrix's runs train past the fixture's
# last step, so its `num_train_steps` changes).
NORMAL = re.compile(r"^(model_dir: |I\d{4} |step \d+/\d+ |W\d{4} .*config_hash changed from )")


@pytest.fixture(scope="module")
def standard(tmp_path_factory):
    return sr.unpack(tmp_path_factory.mktemp("matrix"), checkpoints=True)


@pytest.fixture(scope="module")
def spawner(standard):
    env = sr.child_env(standard.texts, DEVICES)
    with Spawner(env={"XLA_FLAGS": env["XLA_FLAGS"]}, preload=("cairn.models", "cairn.trainer", TRAIN)) as s:
        yield s


def copy_run(standard, tmp: pathlib.Path, name: str) -> pathlib.Path:
    model_dir = tmp / name
    shutil.copytree(standard.run(sr.CHECKPOINTED), model_dir)
    (model_dir / "cairn.lock").unlink(missing_ok=True)
    return model_dir


def argv(model_dir, steps, *extra) -> list:
    """The checkpointed run's own config (its config.json), continued to `steps`."""
    return [
        f"--config={model_dir}/config.json",
        f"--config.model_dir={model_dir}",
        f"--config.num_train_steps={steps}",
        "--config.post_training.final_eval=False",
        *extra,
    ]


def tree(d: pathlib.Path) -> dict:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def flip_a_byte(model_dir: pathlib.Path, step: int) -> None:
    root = model_dir / "checkpoints" / str(step) / "state"
    victim = max((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))


def extra_lines(stderr: str) -> list[str]:
    """The lines a fault added to a run's stderr (see `NORMAL`)."""
    return [line for line in stderr.splitlines() if line.strip() and not NORMAL.match(line.lstrip("\r"))]


def invariants(model_dir: pathlib.Path, last_good: int) -> list[str]:
    """What does not hold of model_dir (empty: all hold)."""
    broken = []
    steps = sorted(int(p.name) for p in (model_dir / "checkpoints").iterdir() if p.name.isdigit())
    if not steps or steps[-1] != last_good:
        broken.append(f"last checkpoint {steps[-1:]} is not step {last_good}")
    manifest = json.loads((model_dir / "manifests" / f"{last_good}.json").read_text())["files"]
    root = model_dir / "checkpoints" / str(last_good)
    for name, entry in manifest.items():
        data = (root / name).read_bytes() if (root / name).is_file() else b""
        if {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} != entry:
            broken.append(f"step {last_good}: {name} differs from its manifest")
    torn = [p.name for p in (model_dir / "checkpoints").iterdir() if "tmp" in p.name]
    if torn:
        broken.append(f"half-written: {torn}")
    rows = [json.loads(line) for line in (model_dir / "summaries" / "metrics.jsonl").read_text().splitlines()]
    counts = collections.Counter((r["task"], r["step"], r["metric"]) for r in rows)
    twice = [k for k, n in counts.items() if n > 1]
    if twice:
        broken.append(f"two histories: {twice[:3]}")
    lost = sorted(
        set(range(1, last_good + 1)) - {r["step"] for r in rows if (r["task"], r["metric"]) == ("train", "loss")}
    )
    if lost:
        broken.append(f"rows lost: no loss at steps {lost}")
    return broken


# Run in the disk-full child before the train program: model_dir on a small tmpfs of its own.
TMPFS = textwrap.dedent(
    """
    import atexit, ctypes, errno, os, shutil, sys
    import orbax.checkpoint as ocp
    model_dir, spare, out, report = {model_dir!r}, {spare}, {out!r}, {report!r}

    def tmpfs():
        libc = ctypes.CDLL(None, use_errno=True)
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(0x10000000 | 0x00020000):  # CLONE_NEWUSER | CLONE_NEWNS
            return "unshare: " + os.strerror(ctypes.get_errno())
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {{uid}} 1"), ("gid_map", f"0 {{gid}} 1")):
            with open(f"/proc/self/{{name}}", "w") as f:
                f.write(text)
        libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None)  # MS_REC | MS_PRIVATE
        used = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(model_dir) for f in fs)
        shutil.copytree(model_dir, model_dir + ".in")
        size = f"size={{used + spare}}".encode()
        if libc.mount(b"tmpfs", model_dir.encode(), b"tmpfs", 0, size):
            return "mount: " + os.strerror(ctypes.get_errno())
        shutil.copytree(model_dir + ".in", model_dir, dirs_exist_ok=True)
        real_exit = os._exit  # the tmpfs goes with the process: copied out as it ends (a forked
        # run ends with os._exit, skipping atexit)

        def copy_out_and_exit(code):
            shutil.copytree(model_dir, out)
            real_exit(code)

        os._exit = copy_out_and_exit
        atexit.register(lambda: os.path.exists(out) or shutil.copytree(model_dir, out))
        return None

    why = tmpfs()
    if why is not None:  # no user namespaces here: the disk fills up at the next save
        real_save = ocp.CheckpointManager.save

        def save(self, step, *args, **kwargs):
            if step > 6:
                raise OSError(errno.ENOSPC, "No space left on device", str(self.directory))
            return real_save(self, step, *args, **kwargs)

        ocp.CheckpointManager.save = save
    with open(report, "w") as f:
        f.write("tmpfs" if why is None else f"injected ENOSPC ({{why}})")
    """
)
# Run in the child before the train program: SIGKILL once step 9 is trained, after step 8's
# checkpoint has committed (waited for, with its manifest) and before the log step (10).
KILL_AT_STEP_9 = textwrap.dedent(
    """
    import os, signal
    from cairn.trainer import loop

    real_log_if_due = loop.TrainLoop.log_if_due

    def log_if_due(self):
        if self.step == 9:
            self.ckpt.wait()
            os.kill(os.getpid(), signal.SIGKILL)
        real_log_if_due(self)

    loop.TrainLoop.log_if_due = log_if_due
    """
)
FILE_SIZE_LIMIT = textwrap.dedent(
    """
    import resource
    resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, 2 << 20))
    """
)


@pytest.fixture(scope="module")
def single(spawner, standard, tmp_path_factory):
    """The single-process rows, each in a child forked from the spawner: `{row: (proc, ...)}`."""
    tmp = tmp_path_factory.mktemp("single")
    env = {"CAIRN_SHAKESPEARE_DIR": standard.texts}
    rows = {}

    def run(row, args, prelude="", *facts):
        start = time.monotonic()
        proc = spawner.call(TRAIN, args, env=env, timeout=600, prelude=prelude)
        rows[row] = (proc, time.monotonic() - start, *facts)

    full = copy_run(standard, tmp, "full")
    out, report = tmp / "full_after", tmp / "full_how"
    prelude = TMPFS.format(model_dir=str(full), spare=SPARE, out=str(out), report=str(report))
    run("disk full", argv(full, 10), prelude, full, out, report)
    big = copy_run(standard, tmp, "big")
    run("file too large", argv(big, 10), FILE_SIZE_LIMIT, big)
    fallback = copy_run(standard, tmp, "fallback")
    flip_a_byte(fallback, 6)
    run("fallback", argv(fallback, 8), "", fallback)
    # Killed after step 8's checkpoint committed, before the log step 10; then resumed. And the
    # same steps uninterrupted.
    cut = copy_run(standard, tmp, "kill_after_commit")
    run("kill after commit", argv(cut, 10), KILL_AT_STEP_9, cut)
    rows["kill after commit"] += ((cut / "summaries" / "metrics.jsonl").read_text(),)  # as the kill left it
    run("kill after commit: resumed", argv(cut, 10), "", cut)
    clean = copy_run(standard, tmp, "uninterrupted")
    run("uninterrupted", argv(clean, 10), "", clean)

    refusals = {
        "every checkpoint corrupt": (),
        "lock held": (),
        "changed config": ("--config.optimizer.learning_rate=0.5",),
        "mesh does not fit": ("--config.partitioning.mesh.model=3",),
    }
    for row, extra in refusals.items():
        model_dir = copy_run(standard, tmp, row.replace(" ", "_"))
        if row == "every checkpoint corrupt":
            for step in (2, 4, 6):
                flip_a_byte(model_dir, step)
        if row == "lock held":  # this test's own process: alive, on this host
            lock = {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time() - 60}
            (model_dir / "cairn.lock").write_text(json.dumps(lock))
        before = tree(model_dir)
        run(row, argv(model_dir, 8, *extra), "", model_dir, before)
    return rows


TABLE: dict = {}  # row -> (exit status, extra lines, invariants), printed at the end


def record(row, code, lines, broken, output=""):
    total = len([line for line in output.splitlines() if line.strip()])
    TABLE[row] = (code, len(lines), total, "hold" if not broken else "; ".join(broken))


def test_a_full_disk_and_a_file_too_large_are_one_line_and_keep_the_last_checkpoint(single):
    for row, words in (("disk full", "no space left on device"), ("file too large", "file too large")):
        proc, seconds, model_dir, *more = single[row]
        if row == "disk full":
            out, report = more
            how = report.read_text()
            if how == "tmpfs":
                model_dir = out  # the tmpfs, copied out at the child's exit
        assert proc.returncode == 2, launch_util.tail(proc)
        lines = extra_lines(proc.stderr)
        broken = invariants(model_dir, 6)
        record(
            f"{row} ({how})" if row == "disk full" else row, proc.returncode, lines, broken, proc.stdout + proc.stderr
        )
        assert proc.stdout.splitlines() == [f"model_dir: {single[row][2]}"], proc.stdout
        assert len(lines) == 1 and lines[0].startswith(f"error: {words} writing checkpoint step 8 in "), lines
        assert lines[0].endswith("the last good checkpoint (step 6) is intact"), lines
        assert broken == [], broken
        if row == "disk full" and how == "tmpfs":  # the free space when the write failed (at most
            # what the tmpfs had to spare; checkpoint_faults_test checks it is measured before the
            # failed step's folder is removed)
            free = re.search(r"\(([0-9.]+) (bytes|KiB|MiB) free\)", lines[0])
            assert free, lines
            scale = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20}[free.group(2)]
            assert float(free.group(1)) * scale < SPARE, lines


def test_a_fallback_keeps_one_history(single):
    proc, seconds, model_dir = single["fallback"]
    lines = extra_lines(proc.stderr)
    broken = invariants(model_dir, 8)
    record("fallback (step 6 corrupt)", proc.returncode, lines, broken, proc.stdout + proc.stderr)
    assert proc.returncode == 0, launch_util.tail(proc)
    assert len(lines) == 2 and "checkpoint at step 6 is unusable" in lines[0] and "using step 4" in lines[1], lines
    assert broken == [], broken
    aside = [json.loads(line) for line in (model_dir / "superseded/summaries/metrics.jsonl").read_text().splitlines()]
    assert {r["step"] for r in aside} == {5, 6} and {r["superseded_after_step"] for r in aside} == {4}
    assert sorted(os.listdir(model_dir / "corrupt_checkpoints")) == ["6"]


def test_a_kill_between_a_commit_and_the_next_log_step_loses_no_row(single):
    proc, seconds, model_dir, metrics = single["kill after commit"]
    assert proc.returncode == -signal.SIGKILL, launch_util.tail(proc)
    rows = [json.loads(line) for line in metrics.splitlines()]
    steps = sorted({r["step"] for r in rows if r["metric"] == "loss"})
    assert steps == list(range(1, 9)), steps  # rows 7-8 written with checkpoint 8, before the log step
    proc, seconds, model_dir = single["kill after commit: resumed"]
    lines = extra_lines(proc.stderr)
    broken = invariants(model_dir, 10)
    record("SIGKILL after commit 8, before log step 10; resumed", proc.returncode, lines, broken, proc.stderr)
    assert proc.returncode == 0, launch_util.tail(proc)
    assert broken == [], broken
    clean = single["uninterrupted"][2]
    check = sr.verify(clean, model_dir)  # fails on a step one run lacks
    assert check.returncode == 0 and "identical through step 10" in check.stdout, check.stdout + check.stderr


@pytest.mark.parametrize("row", ["every checkpoint corrupt", "lock held", "changed config", "mesh does not fit"])
def test_each_refusal_is_one_line_and_writes_nothing(single, row):
    proc, seconds, model_dir, before = single[row]
    lines = extra_lines(proc.stderr)
    unchanged = tree(model_dir) == before
    record(
        f"refused: {row}", proc.returncode, lines, [] if unchanged else ["model_dir changed"], proc.stdout + proc.stderr
    )
    assert proc.returncode == 2, launch_util.tail(proc)
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert unchanged


def wait_for_checkpoint(model_dir: pathlib.Path, step: int, procs, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not (model_dir / "manifests" / f"{step}.json").exists():
        assert all(p.poll() is None for p in procs), "a process ended before the checkpoint"
        assert time.monotonic() < deadline, f"no checkpoint {step} within {timeout} s"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def killed(spawner, standard, tmp_path_factory):
    """The two 2-process rows, run at the same time: `{row: (survivor's exit, stdout+stderr, s)}`."""
    tmp = tmp_path_factory.mktemp("killed")
    rows, jobs = {}, {}
    for row in ("coordinator", "peer"):
        model_dir = copy_run(standard, tmp, row)
        address = f"127.0.0.1:{sr.free_port()}"
        args = argv(
            model_dir,
            40,
        )
        job = []
        for i in range(2):
            env = {
                "CAIRN_SHAKESPEARE_DIR": standard.texts,
                "CAIRN_COORDINATOR_ADDRESS": address,
                "CAIRN_NUM_PROCESSES": "2",
                "CAIRN_PROCESS_ID": str(i),
            }
            out = tmp / f"{row}{i}.log"
            if row == "coordinator" and i == 1:  # the survivor under the supervisor, as on a pod
                env.update(sr.child_env(standard.texts, DEVICES))
                command = [sys.executable, "-m", TRAIN, *args]
                job.append(spawner.popen("cairn.launchers.supervise", command, out, out, env=env))
            else:
                job.append(spawner.popen(TRAIN, args, out, out, env=env))
        jobs[row] = (model_dir, job, address)
    try:
        for row, victim in (("coordinator", 0), ("peer", 1)):
            model_dir, job, address = jobs[row]
            wait_for_checkpoint(model_dir, 8, job)
            os.killpg(job[victim].pid, signal.SIGKILL)
            killed_at = time.monotonic()
            survivor = job[1 - victim]
            code = survivor.wait(timeout=BOUND_S + 120)
            log = tmp / f"{row}{1 - victim}.log"
            rows[row] = (code, log.read_text(errors="replace"), time.monotonic() - killed_at, address, model_dir)
    finally:
        for _, job, _ in jobs.values():
            for p in job:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
    return rows


def test_a_killed_coordinator_or_peer_is_one_line_and_exit_3(killed):
    code, text, seconds, address, model_dir = killed["coordinator"]
    lines = extra_lines(text)
    broken = invariants(model_dir, max(int(p.name) for p in (model_dir / "checkpoints").iterdir() if p.name.isdigit()))
    record(f"killed coordinator (process 1 out in {seconds:.1f} s)", code, lines, broken, text)
    assert code == 3, text[-3000:]
    assert lines == [
        f"error: process 0 of 2 (the coordinator at {address}) stopped responding (its coordination service "
        "is gone); stopping process 1"
    ], text[-3000:]
    assert seconds < BOUND_S + 60
    code, text, seconds, address, model_dir = killed["peer"]
    lines = extra_lines(text)
    lock_left = ["cairn.lock left"] if (model_dir / "cairn.lock").exists() else []
    record(f"killed peer (process 0 out in {seconds:.1f} s)", code, lines, lock_left, text)
    assert code == 3, text[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: process 1 of 2 stopped responding (no heartbeat for ")
    assert "Check failure" not in text and "[Gloo]" not in text
    assert lock_left == []  # the survivor released the model_dir lock as it stopped


def test_zz_the_table(capsys):
    """The matrix's table (printed with `pytest -s`; the rows of the tests that ran)."""
    with capsys.disabled():
        print("\n| fault | exit | fault lines | all lines | invariants |\n|---|---|---|---|---|")
        for row, (code, n, total, state) in TABLE.items():
            print(f"| {row} | {code} | {n} | {total} | {state} |")
    assert TABLE
