"""Hugging Face `tokenizers` is optional and lazy, and the workspace folder `tokenizers/` never
shadows it: checked in a fresh interpreter, and under Bazel's runfiles layout as
tools/testing/pytest_main.py runs a test there (a tree of the workspace's folders, the
`imports = ["."]` paths on PYTHONPATH, the workspace root as the current directory)."""

import os
import pathlib
import subprocess
import sys

# Not resolve(): under Bazel this is the runfiles tree, which holds what the test declares.
ROOT = pathlib.Path(__file__).parents[2]
TARGET = "tests/tokenizers/tokenizer_json_vocabulary_test"
# A few of that file's tests: each builds the vocabulary, and the conftest trains with `tokenizers`.
# None of them imports TensorFlow or transformers (about 8 s of CPU in the child, and neither is
# what the layout can shadow); `tokenizer_json_vocabulary_test` checks those in this process.
SELECTED = "special_ids_are_read or decode_rules or sentinel_layout"


def _python(code: str, cwd: pathlib.Path, path: list) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_import_cairn_tokenizers_does_not_import_hf_tokenizers():
    code = (
        "import sys, cairn.tokenizers\n"
        "assert 'tokenizers' not in sys.modules, sys.modules['tokenizers']\n"
        "assert 'tensorflow' not in sys.modules\n"
        "import tokenizers\n"
        "assert tokenizers.__file__ and 'site-packages' in tokenizers.__file__, tokenizers.__path__\n"
        "print('ok')\n"
    )
    # The repository root is the current directory: its folder `tokenizers/` is on the path.
    done = _python(code, ROOT, [ROOT / "storage", ROOT / "tokenizers"])
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def _runfiles(tmp_path: pathlib.Path) -> pathlib.Path:
    """`<tmp>/t.runfiles/cairn_repo`: the declared files, linked as Bazel links them (no __init__.py)."""
    ws = tmp_path / "t.runfiles" / "cairn_repo"
    files = [TARGET + ".py", "tests/tokenizers/conftest.py", "tools/testing/pytest_main.py"]
    files.append("tools/testing/process_log/sitecustomize.py")  # what pytest_main loads at start
    for lib in ("storage", "tokenizers"):
        files += [str(p.relative_to(ROOT)) for p in (ROOT / lib / "cairn").rglob("*.py")]
    for rel in files:
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).symlink_to(ROOT / rel)
    return ws


def _run_like_bazel(ws: pathlib.Path) -> subprocess.CompletedProcess:
    drop = ("XML_OUTPUT_FILE", "PYTEST_ADDOPTS", "CAIRN_TEST_MODULE")  # this test's own, not the child's
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["TEST_TARGET"] = "//" + TARGET.replace("/tokenizer_json", ":tokenizer_json")
    env["PYTEST_ADDOPTS"] = f"-k '{SELECTED}'"
    # Bazel's stub: the runfiles root, the workspace root and each library's `imports = ["."]`.
    env["PYTHONPATH"] = os.pathsep.join(map(str, [ws.parent, ws, ws / "storage", ws / "tokenizers"]))
    main = ws / "tools" / "testing" / "pytest_main.py"
    return subprocess.run([sys.executable, str(main)], cwd=ws, env=env, capture_output=True, text=True, timeout=600)


def test_vocabulary_test_passes_under_the_runfiles_layout(tmp_path):
    done = _run_like_bazel(_runfiles(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and "failed" not in done.stdout


def test_an_init_py_in_the_workspace_folder_would_shadow_the_package(tmp_path):
    """The control: without `--incompatible_default_to_explicit_init_py` Bazel would create
    `tokenizers/__init__.py`, and `import tokenizers` would find the workspace folder."""
    ws = _runfiles(tmp_path)
    (ws / "tokenizers" / "__init__.py").write_text("")
    done = _run_like_bazel(ws)
    assert done.returncode != 0
    assert "cannot import name" in done.stdout + done.stderr
