"""`cairn.launchers.entry`: the one way a launcher program runs (child processes, as a user runs them)."""

import os
import subprocess
import sys

import pytest

PROGRAM = """
import sys
from absl import flags
from cairn.launchers import entry

WHAT = flags.DEFINE_string("what", "ok", "ok | bad | bug | code")


def body():
    if WHAT.value == "bad":
        raise ValueError("the input is unusable")
    if WHAT.value == "bug":
        raise KeyError("a bug")
    if WHAT.value == "code":
        print("divergent")
        return 1
    print("done")
    return None


entry.run(body, expected=(ValueError,), prefix="prog")
"""


def _run(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-c", PROGRAM, *args], capture_output=True, text=True, env=env, timeout=120)


def test_success_and_the_bodys_own_exit_status():
    ok = _run()
    assert ok.returncode == 0 and ok.stdout == "done\n" and ok.stderr == ""
    code = _run("--what=code")
    assert code.returncode == 1 and code.stdout == "divergent\n"


def test_an_expected_error_is_one_line_with_exit_2():
    bad = _run("--what=bad")
    assert bad.returncode == 2 and bad.stderr == "prog: the input is unusable\n"


def test_verbose_adds_the_traceback():
    bad = _run("--what=bad", "--verbose")
    assert bad.returncode == 2 and "Traceback" in bad.stderr
    assert bad.stderr.rstrip().endswith("prog: the input is unusable")


@pytest.mark.parametrize("args", [["positional"], ["--what=ok", "extra"]])
def test_positional_arguments_are_refused(args):
    out = _run(*args)
    assert out.returncode == 2 and out.stderr.startswith("prog: unexpected arguments [")


def test_an_unexpected_error_is_a_bug_with_its_traceback():
    bug = _run("--what=bug")
    assert bug.returncode == 1 and "Traceback" in bug.stderr and "KeyError: 'a bug'" in bug.stderr


def test_help_exits_0_with_the_flags():
    """absl's own `--help` exits 1; every launcher program answers it with exit 0."""
    proc = _run("--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--what: ok | bad | bug | code" in proc.stdout
