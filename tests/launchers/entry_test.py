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


def test_an_expected_error_named_by_its_module_is_caught_only_once_that_module_is_imported():
    """`"module.Name"` in `expected`: looked up only if the module is loaded (no instance of a
    class can exist before its module runs), so naming it imports nothing."""
    from cairn.launchers import entry

    assert "cairn_entry_test_absent" not in sys.modules
    assert not entry.is_expected(ValueError("x"), ("cairn_entry_test_absent.Error",))
    assert "cairn_entry_test_absent" not in sys.modules
    assert entry.is_expected(KeyError("x"), ("builtins.LookupError",))
    assert not entry.is_expected(KeyError("x"), ("builtins.TypeError", ValueError))
    assert entry.is_expected(KeyError("x"), (TypeError, "builtins.KeyError"))


def test_the_train_entry_point_refuses_a_bad_config_before_importing_jax():
    """A bad config is the commonest first run: its one line comes before JAX, the trainer or
    TensorFlow is imported (about a second of the start-up; benchmarks/startup_bench.py)."""
    config = os.path.join(os.path.dirname(__file__), "..", "..", "launchers", "configs", "shakespeare_t5_tiny.py")
    probe = (
        "import runpy, sys\n"
        f"sys.argv = ['train', '--config={config}', '--config.data.batch_size=-3']\n"
        "try:\n"
        "    runpy.run_module('cairn.launchers.train_main', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    print(e.code, sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'tensorflow', 'flax', 'orbax'}))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout == "2 []\n", proc.stderr[-2000:]
    assert proc.stderr == "error: config key 'data.batch_size': must be >= 1, got -3\n"


MAIN = """
import atexit, sys, threading, time
from absl import flags
from cairn.launchers import entry

WHAT = flags.DEFINE_string("what", "ok", "ok | bad | text")


def body():
    atexit.register(lambda: print("atexit ran"))
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined"))).start()
    print("buffered", end="")
    if WHAT.value == "bad":
        raise ValueError("the input is unusable")
    if WHAT.value == "text":
        sys.exit("a message")
    return 3


def run():
    entry.run(body, expected=(ValueError,), prefix="prog")


entry.main(run)
"""


def _main(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-c", MAIN, *args], capture_output=True, text=True, env=env, timeout=120)


def test_main_runs_the_exit_steps_then_ends_with_the_status():
    """`entry.main` skips only the interpreter's teardown: a running thread is joined, `atexit`
    handlers run and buffered output is flushed before the process ends with the body's status."""
    out = _main()
    assert out.returncode == 3 and out.stdout == "bufferedthread joined\natexit ran\n", out
    bad = _main("--what=bad")
    assert bad.returncode == 2 and bad.stderr == "prog: the input is unusable\n" and "atexit ran" in bad.stdout, bad
    text = _main("--what=text")
    assert text.returncode == 1 and text.stderr == "a message\n" and text.stdout.endswith("atexit ran\n"), text


GLOO_AND_OURS = r"""
import logging, os, sys
from cairn.launchers import process_output

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
process_output.speak_from_process_0(int(sys.argv[1]), 2, verbose=sys.argv[2] == "verbose")
print("ours 1", flush=True)
pieces = (b"[Gloo] Rank 1 is connected to ", b"1", b" peer ranks. ")
pieces += (b"Expected number of connected peer ranks is : ", b"1\n")
for piece in pieces:
    os.write(1, piece)  # as C++ writes it: in pieces, straight to file descriptor 1
os.write(1, b"[Gloo] Rank 1 is connected to \n1\n peer ranks. Expected number of connected peer ranks is : 1\n")
sys.stdout.write("progress 50%\r")  # a line in progress is forwarded before its end
sys.stdout.flush()
logging.getLogger("cairn.x").info("an info line")
logging.getLogger("cairn.x").warning("a warning")
print("ours 2")  # still buffered at exit: flushed through the filter
from cairn.launchers import entry
entry.fail("a one-line error")
"""


@pytest.mark.parametrize("process, verbose", [(0, ""), (1, ""), (1, "verbose")])
def test_process_0_speaks_and_gloo_lines_are_dropped(process, verbose):
    """`process_output.speak_from_process_0`: Gloo's connection lines (even in pieces on lines of
    their own) are dropped from stdout unless verbose, everything else passes in order; a process
    other than 0 logs warnings only (INFO with verbose), its records and its one-line error
    prefixed with its index."""
    proc = subprocess.run(
        [sys.executable, "-c", GLOO_AND_OURS, str(process), verbose],
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)),
        timeout=120,
    )
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 2, err
    if verbose:
        assert out.count("[Gloo]") == 2
    else:
        assert out == "ours 1\nprogress 50%\rours 2\n", out
    prefix = "process 1/2: " if process else ""
    assert f"WARNING {prefix}a warning" in err and f"error: {prefix}a one-line error" in err.splitlines()
    assert (f"INFO {prefix}an info line" in err) == (process == 0 or bool(verbose)), err


ABORTING = r"""
import os, sys
sys.stderr.write("ours\n")
sys.stderr.write("E1207 10:39:54.888670   13628 coordination_service_agent.cc:289] Polled an error\n")
if sys.argv[1] == "abort":
    sys.stderr.write(
        "F1207 10:39:54.888704   13628 client.h:80] Terminating process because the JAX distributed service "
        "detected fatal errors. ... UNAVAILABLE: Failed to send RPC to coordination service.\n"
        "*** Check failure stack trace: ***\n    @     0x7f1f90c40634  absl::LogMessage::SendToLog()\n"
    )
    sys.stderr.flush()
    os.abort()
sys.stderr.write("more\n")
"""


@pytest.mark.parametrize("how", ["abort", "exit"])
def test_the_supervisor_names_a_lost_coordinator_and_passes_the_rest(how):
    """`cairn.launchers.supervise`: a child that dies of SIGABRT after JAX's lost-coordination-service
    lines is one line and exit 3; a child that goes on keeps every line (the held runtime line
    released) and its own exit status."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
        CAIRN_PROCESS_ID="1",
        CAIRN_NUM_PROCESSES="2",
        CAIRN_COORDINATOR_ADDRESS="10.0.0.2:1234",
    )
    command = [sys.executable, "-m", "cairn.launchers.supervise", "--", sys.executable, "-c", ABORTING, how]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    if how == "abort":
        assert proc.returncode == 3, proc.stderr
        assert proc.stderr.splitlines() == [
            "ours",
            "error: process 0 of 2 (the coordinator at 10.0.0.2:1234) stopped responding (its coordination "
            "service is gone); stopping process 1",
        ]
    else:
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.splitlines()[0] == "ours" and proc.stderr.splitlines()[2] == "more"
        assert "coordination_service_agent.cc" in proc.stderr.splitlines()[1]


SLOW_FILTER = r"""
import os, sys, time
from cairn.launchers import process_output

def slow(line, after_gloo):  # a thread starved by a loaded machine
    time.sleep(0.25)
    return False

f = process_output.GlooFilter(drop=slow)
held = os.dup(1)  # a copy of the pipe's write end, as a child process would inherit it
for i in range(24):  # 6 s of the thread's time: more than the 5 s `close` once waited for
    print(f"line {i}")
sys.stdout.write("unended")
start = time.monotonic()
f.close()
sys.stderr.write(f"closed in {time.monotonic() - start:.1f} s\n")
os._exit(0)  # as `entry.exit_now` ends a process: the thread dies with it
"""


def test_the_gloo_filter_forwards_everything_before_it_closes():
    """`GlooFilter.close` waits for its thread to forward every line written before it, even when
    the thread is slow and another copy of the pipe's write end keeps its end of file away (a
    multi-process run lost process 0's last stdout line this way)."""
    proc = subprocess.run(
        [sys.executable, "-c", SLOW_FILTER],
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == "".join(f"line {i}\n" for i in range(24)) + "unended", proc.stdout
