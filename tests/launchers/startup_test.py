"""Start-up noise: the entry points' first import silences TensorFlow's C++ lines and the
TF/CUDA log variables unless `--verbose`; `--verbose` keeps everything."""

import os
import subprocess
import sys

import launch_util
import pytest

from cairn.launchers.quiet_startup import wants_verbose

IMPORT_TF = "import cairn.launchers.quiet_startup, os; print(os.environ.get('TF_CPP_MIN_LOG_LEVEL')); import tensorflow"


@pytest.mark.parametrize(
    "argv,verbose",
    [
        (["x"], False),
        (["x", "--verbose"], True),
        (["x", "--verbose=true"], True),
        (["x", "--verbose", "--noverbose"], False),
        (["x", "--verbose=0"], False),
        (["x", "--", "--verbose"], False),
    ],
)
def test_verbose_is_read_from_the_command_line(argv, verbose):
    assert wants_verbose(argv) is verbose


def run_python(*argv):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run(
        [sys.executable, "-c", IMPORT_TF, *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(launch_util.REPO),
        timeout=300,
    )


def test_tensorflow_imports_quietly_unless_verbose():
    quiet = run_python()
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.strip() == "3" and quiet.stderr == ""
    loud = run_python("--verbose")
    assert loud.returncode == 0, loud.stderr
    assert loud.stdout.strip() == "None" and loud.stderr != ""  # TensorFlow's start-up lines
