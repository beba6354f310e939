"""Without Bazel (README.md, "Without Bazel"): the eight libraries install with pip, offline,
from a wheelhouse built here (or editable from their folders), and the console scripts run.

Cheap by design: `pip wheel --no-deps` of the eight folders (seconds), venvs without pip that
borrow this interpreter's third-party packages through a .pth file (nothing is downloaded or
copied), and one `--help` per console script. Every check runs with the cwd outside the
repository and no PYTHONPATH, so cairn can only come from what pip installed.
"""

import os
import pathlib
import subprocess
import sys
import tomllib
import venv

import pytest

PIP_TIMEOUT = 600
RUN_TIMEOUT = 300


def _pip(*args) -> None:
    command = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", *map(str, args)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT)
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def _borrowing_venv(env_dir: pathlib.Path) -> pathlib.Path:
    """A venv whose third-party packages are this interpreter's (a .pth file), with no cairn."""
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"], check=True, capture_output=True, text=True
    ).stdout.strip()
    ours = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    pathlib.Path(site, "borrowed.pth").write_text("\n".join(ours) + "\n")
    return python


def _run(argv, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "BUILD_WORKING_DIRECTORY")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=RUN_TIMEOUT)


IMPORT_ALL = """
import importlib, importlib.metadata as md, sys
for lib in sys.argv[1].split(","):
    module = importlib.import_module("cairn." + lib)
    assert module.__file__.startswith(sys.argv[2]), (lib, module.__file__)
    assert md.version("cairn-" + lib) == module.__version__, lib
print("ok")
"""


@pytest.fixture(scope="module")
def wheel_venv(repo_root, imports, tmp_path_factory):
    """`pip install --no-index --find-links WHEELHOUSE cairn-launchers`: the siblings resolve."""
    out = tmp_path_factory.mktemp("pip")
    srcs = [imports.copy_library(repo_root, lib, out / "src" / lib) for lib in imports.libraries]
    wheelhouse = out / "wheelhouse"
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", wheelhouse, *srcs)
    python = _borrowing_venv(out / "venv")
    _pip("--python", python, "install", "--no-index", "--find-links", wheelhouse, "-q", "cairn-launchers")
    return out


def test_launchers_brings_every_library_from_the_wheelhouse(wheel_venv, imports):
    env_dir = wheel_venv / "venv"
    done = _run([env_dir / "bin" / "python", "-c", IMPORT_ALL, ",".join(imports.libraries), env_dir], cwd=wheel_venv)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


def test_datatasks_requires_array_record_without_an_extra(wheel_venv):
    code = "import importlib.metadata as md; print('\\n'.join(md.requires('cairn-datatasks')))"
    done = _run([wheel_venv / "venv" / "bin" / "python", "-c", code], cwd=wheel_venv)
    assert done.returncode == 0, done.stderr[-3000:]
    base = [r for r in done.stdout.splitlines() if "extra ==" not in r]
    assert any(r.startswith("array-record") for r in base), done.stdout


def _scripts(repo_root: pathlib.Path) -> dict:
    return tomllib.loads((repo_root / "launchers" / "pyproject.toml").read_text())["project"]["scripts"]


def test_console_scripts_cover_the_bazel_binaries(repo_root, wheel_venv):
    scripts = _scripts(repo_root)
    assert {"cairn-train", "cairn-eval", "cairn-infer", "cairn-cache-tasks", "cairn-verify"} <= set(scripts)
    build = (repo_root / "launchers" / "BUILD").read_text()
    for name in scripts:
        target = name.removeprefix("cairn-").replace("-", "_")
        assert f'name = "{target}"' in build, f"{name}: no //launchers:{target}"
        path = wheel_venv / "venv" / "bin" / name
        assert path.is_file(), name
        assert path.read_text().splitlines()[0].startswith(f"#!{wheel_venv / 'venv'}"), name


# Run by the venv's interpreter as `python -c _HELP_EACH OUT_DIR SCRIPT...`: imports the
# library-owned choices every config program's `--help` lists (`schema.describe()`: Flax, JAX,
# optax; ~1.2 s of CPU), then for each console script forks a child that runs the script's file as
# `__main__` with `sys.argv = [script, "--help"]` (what its shebang line does, minus a new
# interpreter), stdout and stderr into `OUT_DIR/<name>.out` and `.err`, and prints
# `<name> <exit status>` once the child is done.
_HELP_EACH = """
import os, runpy, sys
from cairn.launchers import schema
schema.describe()
out_dir = sys.argv[1]
for script in sys.argv[2:]:
    name = os.path.basename(script)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        for fd, suffix in ((1, ".out"), (2, ".err")):
            os.dup2(os.open(os.path.join(out_dir, name + suffix), os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.argv = [script, "--help"]
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(name, os.waitstatus_to_exitcode(status), flush=True)
"""


def test_every_console_script_prints_its_programs_help(repo_root, wheel_venv, tmp_path):
    """`--help` shows the program's docstring, as `python -m cairn.launchers.<module>` does.
    Each script's file runs in a process of its own, forked from one interpreter of the venv
    that imported the choices every `--help` lists (`_HELP_EACH`); the shebang lines are
    `test_console_scripts_cover_the_bazel_binaries`'s, and `cairn-train` and `cairn-verify` run
    from a new interpreter in the tests below."""
    names = list(_scripts(repo_root))
    bin_dir = wheel_venv / "venv" / "bin"
    done = _run([bin_dir / "python", "-c", _HELP_EACH, tmp_path, *(bin_dir / n for n in names)], cwd=wheel_venv)
    assert done.returncode == 0, done.stderr[-3000:]
    statuses = dict(line.split() for line in done.stdout.splitlines())
    assert sorted(statuses) == sorted(names), done.stdout
    for name in names:
        target = name.removeprefix("cairn-").replace("-", "_")
        out, err = ((tmp_path / f"{name}{s}").read_text() for s in (".out", ".err"))
        assert statuses[name] == "0", f"{name}: exit {statuses[name]}\n{err[-2000:]}"
        assert f"//launchers:{target}" in out, f"{name} --help:\n{out[-2000:]}"


def test_cairn_train_loads_an_experiment_and_refuses_a_bad_key(wheel_venv):
    # The experiment file imports cairn.launchers.config_base from the venv; the bad preset is
    # found before anything is built or written.
    config = wheel_venv / "src" / "launchers" / "configs" / "shakespeare_t5_tiny.py"
    argv = [wheel_venv / "venv" / "bin" / "cairn-train", f"--config={config}", "--config.model.preset=nope"]
    done = _run(argv, cwd=wheel_venv)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith("error: config key 'model.preset': unknown preset 'nope'")


def test_cairn_verify_names_a_missing_run(wheel_venv, tmp_path):
    argv = [wheel_venv / "venv" / "bin" / "cairn-verify", f"--run_a={tmp_path / 'a'}", f"--run_b={tmp_path / 'b'}"]
    done = _run(argv, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("verify: ") and str(tmp_path / "a") in last, done.stderr


def test_editable_installs_of_the_eight_folders(repo_root, imports, tmp_path):
    """`pip install -e ./storage -e ./tokenizers ...`: the namespace spans eight source folders."""
    srcs = [imports.copy_library(repo_root, lib, tmp_path / "src" / lib) for lib in imports.libraries]
    python = _borrowing_venv(tmp_path / "venv")
    editables = [arg for src in srcs for arg in ("-e", src)]
    _pip("--python", python, "install", "--no-index", "--no-build-isolation", "-q", *editables)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    done = _run([python, "-c", IMPORT_ALL, ",".join(imports.libraries), tmp_path / "src"], cwd=outside)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
    assert (tmp_path / "venv" / "bin" / "cairn-train").is_file()
