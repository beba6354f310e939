"""Running the launchers' entry points in child processes (as a user would), with small data."""

import contextlib
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any
from unittest import mock

import standard_runs
from forks import ForkServer, Spawner, child_env, run_forked, run_forked_each  # noqa: F401 (this module's API)

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


def typed(config: Any) -> Any:
    """The typed keys (`schema.Config`) of a loaded config, its schema checked
    (`run_spec.checked_keys`): what the launchers' checks take."""
    from cairn.launchers import run_spec

    return run_spec.checked_keys(config)[1]


def spec(config: Any) -> Any:
    """The `RunSpec` of a loaded, path-resolved config (`run_spec.load`): what the entry points take."""
    from cairn.launchers import run_spec

    return run_spec.load(config)


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
        infer_main.infer(spec(config), str(output), str(model_dir), out=printed.append, **kwargs)
        return printed
