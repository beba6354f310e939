"""The CI figures tools: tools/ci/suite_figures.py (a .ci/run log and test logs -> the record the
README quotes, rendered), tools/ci/ledger.py (docs/testing.md lists every test target and test
function; a missing one is named) and tools/ci/bazel_timeline.py (Bazel's trace profile -> the
long build actions, the busy and idle slot-seconds, the tail) and tools/ci/module_sizes.py (the
largest library modules, a report)."""

import importlib.util
import os
import pathlib
import sys

# Under Bazel this file is a runfiles link to the checkout: its real path finds the repository.
ROOT = pathlib.Path(os.path.realpath(__file__)).parent.parent


def _tool(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "ci" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _xml(path, wall, procs, train):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="2" time="1">'
        f'<properties><property name="wall_s" value="{wall}" /><property name="processes" value="{procs}" />'
        f'<property name="train_processes" value="{train}" /><property name="cpu_s" value="{2 * wall}" />'
        f"</properties></testsuite></testsuites>"
    )


def test_a_ci_log_becomes_a_record_and_the_readme_block(tmp_path):
    tool = _tool("suite_figures")
    logs = tmp_path / "testlogs"
    lines = []
    for i in range(20):
        _xml(logs / "tests" / f"t{i}_test" / "test.xml", wall=float(i + 1), procs=i, train=i % 3)
        lines.append(f"//tests:t{i}_test    PASSED in {i + 1}.0s")
    log = tmp_path / "ci.log"
    log.write_text("\n".join(lines + ["== results", "57 passed, 0 failed", ""]))
    machine = {"cores": 2, "cpu": "Test CPU", "load_before": 0.1, "load_after": 2.0}
    record = tool.record_from(log, logs, 754.4, machine, "abc1234")
    assert record["result"] == "57 passed, 0 failed" and record["targets"] == 20
    assert record["sum_s"] == sum(range(1, 21)) and record["train_processes"] == sum(i % 3 for i in range(20))
    assert [s["label"] for s in record["slowest"][:2]] == ["//tests:t19_test", "//tests:t18_test"]
    assert len(record["slowest"]) == 15
    block = tool.render(record)
    assert record["cpu_s"] == 2 * sum(range(1, 21))
    assert (
        "took 12 min 34 s (57 passed, 0 failed)" in block
        and "20 test targets took 210 s in all (420 s of CPU)" in block
    )
    readme = f"intro\n{tool.BEGIN}\nold\n{tool.END}\nrest\n"
    updated = tool.replace_block(readme, block)
    assert tool.quoted_block(updated) == block and updated.endswith("rest\n")


def test_the_ledger_lists_every_target_and_test_function():
    ledger = _tool("ledger")
    items = ledger.targets()
    assert len(items) > 100
    text = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    missing = ledger.missing(text, items)
    assert missing == [], f"rerun `python3 tools/ci/ledger.py --times T.json`; not listed: {missing[:10]}"
    # A target or a test the ledger does not name is reported.
    fake = [{"label": "//tests:nowhere_test", "path": "", "doc": "", "tests": [("test_x", "")]}]
    assert ledger.missing(text, fake) == ["//tests:nowhere_test"]
    first = items[0]
    section = text.split(f"### `{first['label']}`", 1)[1].split("\n### ", 1)[0]
    name = first["tests"][0][0]
    assert ledger.missing(text.replace(section, section.replace(f"- `{name}`", "- (gone)", 1)), [first]) == [
        f"{first['label']}::{name}"
    ]
    # A module of a cairn_py_test_group is listed under its group, whose time it shows.
    grouped = {i["path"]: i for i in items}["tests/datatasks/inspect_test.py"]
    assert grouped["target"] == "//tests/datatasks:text_tasks_group_test"
    assert grouped["label"] == "//tests/datatasks:text_tasks_group_test (inspect_test)"
    times = {grouped["target"]: {"wall_s": 30.0}}
    assert "### `//tests/datatasks:text_tasks_group_test (inspect_test)` (30 s for the group)" in ledger.generated(
        [grouped], times
    )


def test_the_readme_quotes_the_recorded_suite_figures():
    """README.md's suite block is `render` of docs/test_suite.json, the record of a measured
    `.ci/run` on a new clone (`python3 tools/ci/suite_figures.py`): never typed by hand."""
    import json

    tool = _tool("suite_figures")
    record = json.loads((ROOT / "docs" / "test_suite.json").read_text())
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert tool.quoted_block(readme) == tool.render(record), "rerun python3 tools/ci/suite_figures.py"
    # A clean run of the whole suite (94 targets at d1153f6, after small modules were grouped),
    # not of a few targets.
    assert ", 0 failed" in record["result"] and record["targets"] >= 80, record


def test_the_timeline_finds_the_long_build_and_the_tail(tmp_path, capsys):
    """A genrule of 10 s beside a test, then two tests, then one test alone for 4 s: the genrule is
    named, 4 slot-seconds idle in the tail (2 slots), 4 idle in all."""
    import gzip
    import json

    tool = _tool("bazel_timeline")

    def event(name, start, dur):
        return {"cat": "action processing", "name": name, "ph": "X", "ts": start * 10**6, "dur": dur * 10**6}

    events = [
        {"cat": "build phase marker", "name": "Launch Blaze", "ts": 0},
        event("Executing genrule //tests/fixtures:standard_runs", 0, 10),
        event("Testing //tests:a_test", 0, 10),
        event("Testing //tests:b_test", 10, 6),
        event("Testing //tests:c_test", 10, 2),
        event("Testing //tests:d_test", 12, 4),
        event("Testing //tests:e_test", 16, 4),
    ]
    profile = tmp_path / "command.profile.gz"
    with gzip.open(profile, "wt") as f:
        json.dump({"traceEvents": events}, f)
    s = tool.summary(tool.read_actions(profile), jobs=2)
    assert [b.name for b in s["builds"]] == ["Executing genrule //tests/fixtures:standard_runs"]
    assert s["span_s"] == 20 and s["busy_s"] == 36 and s["tests"] == 5
    assert s["idle_slot_s"] == 4 and s["tail_idle_slot_s"] == 4
    assert tool.main([str(profile)]) == 0
    out = capsys.readouterr().out
    assert "standard_runs" in out and "of which 4.0 in the tail" in out
    assert tool.main([str(tmp_path / "missing.gz")]) == 2


def test_the_module_report_lists_the_longest_modules_first():
    sizes = _tool("module_sizes").module_sizes(ROOT)
    assert len(sizes) > 100 and all(path.endswith(".py") and "/cairn/" in path for path, _, _ in sizes)
    assert [n for _, n, _ in sizes] == sorted((n for _, n, _ in sizes), reverse=True)
    path, lines, _ = sizes[0]
    assert lines == len((ROOT / path).read_text(encoding="utf-8").splitlines())
    table = _tool("module_sizes").report(sizes, 3).splitlines()
    assert len(table) == 2 + 3 + 1 and table[2].startswith(f"| {path} | {lines} |")
