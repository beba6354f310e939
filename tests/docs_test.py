"""The project's documents cite only what the repository holds: every `docs/design.md §N` names
a section that exists, nothing cites the design notes of a document outside the repository, and
each library README links its section of docs/design.md."""

import os
import re
import subprocess

# Under Bazel this file is a runfiles link to the checkout: its real path finds the repository.
ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
LIBRARIES = ("storage", "tokenizers", "datatasks", "partitioning", "models", "evaluation", "trainer", "launchers")
TEXT_SUFFIXES = (
    ".py",
    ".md",
    ".bzl",
    ".sh",
    ".toml",
    ".yaml",
    ".txt",
    "BUILD",
    "WORKSPACE",
    ".bazelrc",
    "run",
    "bazelw",
)


def _tracked_text_files() -> list:
    """Every file git tracks (or, outside a checkout, every file below the root) that is text."""
    try:
        names = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        names = [os.path.relpath(os.path.join(d, f), ROOT) for d, _, fs in os.walk(ROOT) for f in fs]
    return [n for n in names if n.endswith(TEXT_SUFFIXES) and os.path.isfile(os.path.join(ROOT, n))]


def _read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8", errors="replace") as f:
        return f.read()


def _sections() -> set:
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", _read("docs/design.md"), flags=re.M))


def test_design_sections_exist_for_every_citation():
    sections = _sections()
    assert {"1", "2", "3", "3.2", "4", "5", "6", "7", "8"} <= sections, sorted(sections)
    missing = []
    for name in _tracked_text_files():
        for cited in re.findall(r"docs/design\.md §(\d+(?:\.\d+)?)", _read(name)):
            if cited not in sections:
                missing.append(f"{name}: §{cited}")
    assert not missing, missing


def test_no_citation_of_a_document_outside_the_repository():
    this = os.path.relpath(os.path.realpath(__file__), ROOT)
    outside = [
        name
        for name in _tracked_text_files()
        if name != this and re.search(r"(?<!docs/design\.md )\bDESIGN(\.md)? §|\.\./shared", _read(name))
    ]
    assert not outside, outside


def test_each_library_readme_links_the_design_document():
    unlinked = [lib for lib in LIBRARIES if "docs/design.md" not in _read(f"{lib}/README.md")]
    assert not unlinked, unlinked


def _cairn_dependencies(library: str) -> set:
    """The cairn libraries `library`'s pyproject.toml requires (`cairn-storage>=...` -> storage)."""
    text = _read(f"{library}/pyproject.toml")
    block = re.search(r"^dependencies = \[(.*?)^\]", text, flags=re.M | re.S)
    return set(re.findall(r'"cairn-(\w+)', block.group(1))) if block else set()


def test_readme_pip_lines_install_what_each_library_needs():
    # `pip install ./tokenizers` alone fails: pip cannot find cairn-storage, which it requires.
    # Every `pip install ./lib ...` line of a README names the cairn libraries each one needs.
    lines = []
    for name in _tracked_text_files():
        if name.endswith("README.md"):
            lines += [(name, line) for line in _read(name).splitlines() if re.search(r"pip install .*\./\w", line)]
    assert len(lines) >= 3
    for name, line in lines:
        command = re.split(r"(?:^|\s)#\s", line.split("`pip install", 1)[-1])[0]
        listed = set(re.findall(r"\./(\w+)", command))
        for library in listed & set(LIBRARIES):
            missing = _cairn_dependencies(library) - listed
            assert not missing, f"{name}: {line.strip()!r} installs {library} without {sorted(missing)}"


def test_every_module_the_contributors_page_names_exists():
    """docs/contributing.md says where things live: each `lib/cairn/...` path it names exists,
    so a rename or a merge of modules that forgets the page fails here."""
    text = _read("docs/contributing.md")
    paths = sorted(set(re.findall(r"`([a-z_]+/cairn/[a-z_/]+(?:\.py)?/?)`", text)))
    assert len(paths) > 40, paths
    missing = [p for p in paths if not os.path.exists(os.path.join(ROOT, p))]
    assert not missing, f"docs/contributing.md names modules that do not exist: {missing}"
