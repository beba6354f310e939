"""Running the launchers' entry points in child processes (as a user would), with small data."""

import contextlib
import os
import pathlib
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any
from unittest import mock

import standard_runs

REPO = pathlib.Path(__file__).absolute().parent.parent.parent
CONFIGS = REPO / "launchers" / "configs"
T5_CONFIG = str(CONFIGS / "shakespeare_t5_tiny.py")
LM_CONFIG = str(CONFIGS / "shakespeare_lm_tiny.py")


def small_texts(tmp: pathlib.Path) -> str:
    """A `$CAIRN_SHAKESPEARE_DIR` with two short plays (tests/fixtures/standard_runs.py)."""
    return standard_runs.small_texts(tmp)


def standard_data(tmp: pathlib.Path) -> tuple:
    """`(texts, cache_dir)`: the standard runs' two short plays and their cached default task
    (tests/fixtures/standard_runs.py, unpacked into `tmp`), for tests whose property is not the
    caching: their first training run then caches nothing and imports no TensorFlow. Caching in
    the first run of a fresh cache_dir is checked by train_test and train_faults_test's data
    errors."""
    std = standard_runs.unpack(tmp)
    return std.texts, str(std.cache)


def _with_device_count(xla_flags: str, count: int) -> str:
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", xla_flags)
    return f"--xla_force_host_platform_device_count={count} {flags}".strip()


@contextlib.contextmanager
def devices(count: int, this_process: bool = False) -> Iterator[int]:
    """Inside, the processes this test starts that do not set `XLA_FLAGS` themselves (they
    inherit this process's) run on `count` virtual CPU devices instead of
    `tools/testing/pytest_main.py`'s 8; the variable is restored after. JAX in this process
    keeps the devices it has: it is started first, on this process's own `XLA_FLAGS` (so that
    a test module run after this one in the same pytest run sees the usual 8). With
    `this_process`, JAX in this process starts on `count` instead, unless it started already
    (an earlier module of the same pytest run): the processes then get as many devices as it
    has, so that what this process computes shares their layout. Yields the count they get.

    For tests whose properties need no mesh of 8 (a decode, an eval, a console's output): a
    training child on 1-2 devices costs about half the CPU of one on 8 (mostly compiling).
    Never for a run whose bits a test compares with a standard run
    (tests/fixtures/standard_runs.py): it must train on that run's layout."""
    import jax

    old = os.environ.get("XLA_FLAGS")
    if not this_process:
        jax.device_count()  # started on this process's flags, before they change
    os.environ["XLA_FLAGS"] = _with_device_count(old or "", count)
    try:
        if this_process:
            if jax.device_count() != count:  # JAX had started: the children follow it
                count = jax.device_count()
                os.environ["XLA_FLAGS"] = _with_device_count(old or "", count)
        yield count
    finally:
        if old is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = old


def devices_fixture(count: int, this_process: bool = False) -> Any:
    """A module-scoped autouse fixture `devices` (assign it to that name in a test module):
    every test of the module runs inside `devices(count, this_process)`, and a test that takes
    `devices` gets the count."""
    import pytest

    @pytest.fixture(scope="module", autouse=True, name="devices")
    def _devices() -> Iterator[int]:
        with devices(count, this_process) as n:
            yield n

    return _devices


def child_env(env: dict = None) -> dict:
    """This process's environment with `env` on top, and 8 CPU devices and quiet TensorFlow by
    default: what every entry point started here runs with."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    full_env.setdefault("JAX_PLATFORMS", "cpu")
    full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return full_env


def run(module: str, args: list, env: dict = None, timeout: int = 300, cwd: str = None) -> subprocess.CompletedProcess:
    """`python -m <module> <args>`; returns the completed process (text output)."""
    full_env = child_env(env)
    return subprocess.run(
        [sys.executable, "-m", module] + list(args),
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd or str(REPO),
    )


def train(args: list, **kwargs) -> subprocess.CompletedProcess:
    return run("cairn.launchers.train_main", args, **kwargs)


def tail(proc: subprocess.CompletedProcess, n: int = 4000) -> str:
    return f"rc={proc.returncode}\nstdout:\n{proc.stdout[-n:]}\nstderr:\n{proc.stderr[-n:]}"


def tiny_tokenizer_json(path):
    """A 300-id byte-level BPE tokenizer.json (with <pad> and </s>) trained on a short text at `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["to be or not to be", "that is the question"] * 20, trainer)
    tok.save(str(path))
    return path


def infer_in_process(model_dir, output, env: dict = None, **kwargs) -> list:
    """`cairn.launchers.infer_main.infer` on a run's saved config (`<model_dir>/config.json`), in
    this process: what `python -m cairn.launchers.infer_main --config=<model_dir>/config.json
    --output=<output> ...` does once its flags are parsed, without a new interpreter (~10 s of
    imports and pipeline tracing each). For tests of what infer writes; the files that test
    infer's own process (exit status, one-line errors, a kill) run it as a child. `env` is set
    for the call; `kwargs` go to `infer` (`chunk_size`, `mode`, `step`, `input_file`, ...).
    Returns the lines infer printed."""
    from cairn.launchers import config_io, infer_main

    with mock.patch.dict(os.environ, env or {}):
        config = config_io.resolve_paths(config_io.load_saved_config(os.path.join(model_dir, "config.json")))
        printed = []
        infer_main.infer(config, str(output), str(model_dir), out=printed.append, **kwargs)
        return printed


# One interpreter imports the preloaded modules, then forks a child per run: each child sets the
# run's environment variables (None: unset), runs its prelude, imports its entry point's module
# (at once if preloaded), runs its `run()` with its argv (stdout and stderr to files, stdin from
# /dev/null) and exits with its status. (Two entry points may define the same absl flag: only the
# child imports its own.) `_FORKED` then forks the runs of `runs.json` a batch at once (the
# processes of one job), batches one after the other; `_SERVER` forks one run per line of its
# stdin and answers, once that run ended, with a line `[i, exit status, seconds]`.
_CHILD = """
import importlib, json, os, sys, time, traceback
out_dir = sys.argv[1]
for name in sys.argv[2:]:
    importlib.import_module(name)

def child(i, r):
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, stream in ((1, "out"), (2, "err")):
        os.dup2(os.open(os.path.join(out_dir, f"{i}.{stream}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    for key, value in r["env"].items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    code = 0
    try:
        exec(r["prelude"], {})
        module = importlib.import_module(r["module"])
        sys.argv = [module.__file__, *r["argv"]]
        module.run()
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

def fork(i, r):
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child(i, r)
    return pid
"""

_FORKED = (
    _CHILD
    + """
with open(os.path.join(out_dir, "runs.json")) as f:
    runs = json.load(f)
for batch in sorted({r["batch"] for r in runs}):
    started = {}
    for i, r in enumerate(runs):
        if r["batch"] == batch:
            started[fork(i, r)] = (i, time.monotonic())
    while started:
        pid, status = os.wait()
        if pid not in started:
            continue
        i, start = started.pop(pid)
        with open(os.path.join(out_dir, f"{i}.rc"), "w") as f:
            f.write(f"{os.waitstatus_to_exitcode(status)} {time.monotonic() - start}")
"""
)

_SERVER = (
    _CHILD
    + """
for line in sys.stdin:
    i, r = json.loads(line)
    start = time.monotonic()
    _, status = os.waitpid(fork(i, r), 0)
    print(json.dumps([i, os.waitstatus_to_exitcode(status), time.monotonic() - start]), flush=True)
"""
)


def run_forked(
    module: str,
    argvs: list,
    env: dict = None,
    timeout: int = 300,
    preload: tuple = (),
    together: bool | list = False,
    child_envs: list = None,
) -> list:
    """`python -m <module> <argv>` for each of `argvs`, as one interpreter that imports `module`
    once and forks a child per argv, which calls `module.run()` with `sys.argv` set: each run
    starts from a fresh interpreter's state after `import <module>` (flags unparsed, nothing
    else run), with its own exit status, stdout and stderr; `preload`: modules the runs import
    anyway, imported once before the forks. The runs go one after the other, or with
    `together` all at once (the processes of one multi-process job), or with `together` a
    list of batch numbers (one per argv) a batch at once, batches in order; `child_envs`: per argv,
    variables set (None: unset) in that child only, before it runs (`XLA_FLAGS` too: JAX has not
    started when it forks). Returns a CompletedProcess per argv, with `seconds`: its wall time."""
    child_envs = child_envs or [{} for _ in argvs]
    if isinstance(together, list):
        batches = together
    else:
        batches = [0 if together else i for i in range(len(argvs))]
    spec = [
        {"module": module, "argv": list(map(str, a)), "env": dict(e), "prelude": "", "batch": b}
        for a, e, b in zip(argvs, child_envs, batches, strict=True)
    ]
    return _fork_runs(spec, env, timeout, (*preload, module))


def run_forked_each(runs: list, env: dict = None, timeout: int = 300, preload: tuple = ()) -> list:
    """`run_forked` for runs of several entry points, one after the other: `runs` is a list of
    `(module, argv, extra_env)` or `(module, argv, extra_env, prelude)`, `prelude` Python source
    the child runs first (a fault injected into a library, say); the interpreter imports
    `preload` before the forks, each child its own module (entry points that define the same
    flags cannot share an interpreter: preload at most one of those)."""
    spec = [
        {
            "module": r[0],
            "argv": list(map(str, r[1])),
            "env": dict(r[2] or {}),
            "prelude": r[3] if len(r) > 3 else "",
            "batch": i,
        }
        for i, r in enumerate(runs)
    ]
    return _fork_runs(spec, env, timeout, preload)


def _fork_runs(spec: list, env: dict, timeout: int, preload: tuple) -> list:
    """Runs `spec` (dicts: module, argv, env, prelude, batch) through `_FORKED`."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as out_dir:
        with open(os.path.join(out_dir, "runs.json"), "w") as f:
            json.dump(spec, f)
        driver = _start_driver(_FORKED, out_dir, preload, env, stdin=None)
        try:
            _, err = driver.communicate(timeout=timeout)
        finally:
            _kill_group(driver)
        assert driver.returncode == 0, f"the driver failed: {err[-3000:]}"
        procs = []
        for i, r in enumerate(spec):
            code, seconds = _read(out_dir, i, "rc").split()
            procs.append(_completed(out_dir, i, r, int(code), float(seconds)))
        return procs


def _start_driver(script: str, out_dir: str, preload: tuple, env: dict, stdin: Any) -> subprocess.Popen:
    # Its own process group, so that a timeout kills the forked runs too, not just the driver.
    return subprocess.Popen(
        [sys.executable, "-c", script, out_dir, *preload],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(env),
        cwd=str(REPO),
        start_new_session=True,
    )


def _kill_group(driver: subprocess.Popen) -> None:
    try:
        os.killpg(driver.pid, signal.SIGKILL)  # anything of the group still running
    except ProcessLookupError:
        pass
    driver.wait()


def _read(out_dir: str, i: int, ext: str) -> str:
    with open(os.path.join(out_dir, f"{i}.{ext}"), encoding="utf-8", errors="replace") as f:
        return f.read()


def _completed(out_dir: str, i: int, run: dict, code: int, seconds: float) -> subprocess.CompletedProcess:
    proc = subprocess.CompletedProcess(
        [run["module"], *run["argv"]], code, _read(out_dir, i, "out"), _read(out_dir, i, "err")
    )
    proc.seconds = seconds  # from the fork to the child's exit
    return proc


class ForkServer:
    """`run_forked` one run at a time, for a whole test module: one interpreter imports `module`
    (and `preload`) once and stays; each `run(argv)` forks a child of it that runs
    `python -m <module> <argv>` from that state (flags unparsed, nothing else run) and waits for
    it: its own exit status, stdout and stderr, as `launch_util.run` returns them, without a new
    interpreter's start-up and imports each time (about 1-2 s of CPU per program). For runs that
    end by themselves (refusals, short runs); a run the test signals needs a process of its own.
    `env`: the interpreter's variables on top of this process's (as `child_env`); each run's
    `env` is set in its child only (None: unset; `XLA_FLAGS` too: JAX has not started)."""

    def __init__(self, module: str, env: dict = None, preload: tuple = ()):
        import tempfile

        self.module = module
        self._dir = tempfile.TemporaryDirectory()
        self._count = 0
        self._driver = _start_driver(_SERVER, self._dir.name, (*preload, module), env, stdin=subprocess.PIPE)

    def run(self, argv: list, env: dict = None, timeout: float = 300, prelude: str = "") -> subprocess.CompletedProcess:
        """`argv` run in a child forked from the interpreter; fails (and ends the server) when
        it has not exited within `timeout` seconds."""
        import json
        import select

        i, self._count = self._count, self._count + 1
        spec = {"module": self.module, "argv": list(map(str, argv)), "env": dict(env or {}), "prelude": prelude}
        self._driver.stdin.write(json.dumps([i, spec]) + "\n")
        self._driver.stdin.flush()
        ready, _, _ = select.select([self._driver.stdout], [], [], timeout)
        line = self._driver.stdout.readline() if ready else ""
        if not line:
            self.close()
            raise AssertionError(
                f"{argv}: no exit within {timeout} s (or the server died): {self._driver.stderr.read()[-3000:]}"
            )
        _, code, seconds = json.loads(line)
        return _completed(self._dir.name, i, spec, code, seconds)

    def close(self) -> None:
        """Ends the interpreter (and any run still going)."""
        if self._driver.poll() is None:
            self._driver.stdin.close()
            try:
                self._driver.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        _kill_group(self._driver)
        self._dir.cleanup()

    def __enter__(self) -> "ForkServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
