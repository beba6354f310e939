#!/usr/bin/env python3
"""Where the test suite's time goes: each test target's wall time and the Python processes it
started (training runs apart), read from the JUnit XML that every target leaves in Bazel's
test logs (`bazel-testlogs/<package>/<name>/test.xml`).

`tools/testing/pytest_main.py` writes these properties into that XML: `wall_s` (from the
interpreter's start to pytest's end), `cpu_s` (CPU seconds of the test process and of every
process it waited for: on two cores the suite's wall time is at least half their sum),
`processes` (Python processes the test started, as `tools/testing/process_log/sitecustomize.py`
logged them), `train_processes` (those that ran the train entry point or a training worker) and
`tensorflow_processes` (the test process and children that imported TensorFlow, about 4 s
each; children killed before exiting are not counted). A target without them (written by an
older pytest_main) shows pytest's own suite time and `-`.

Usage:
    test_times.py [TESTLOGS_DIR] [--top N] [--log BAZEL_LOG] [--json OUT] [--markdown] [--children N]

TESTLOGS_DIR defaults to `./bazel-testlogs`. With `--log`, only the targets named in that
`bazel test` log's summary are counted (a stale test.xml of a target that is gone is left
out), and each is marked `cached` when Bazel did not run it again. `--top N` prints the N
slowest (default: all); the totals always cover every target. `--children N` adds the N child
processes that used the most CPU, over all those targets, from the process logs pytest_main keeps
in each target's undeclared outputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import re
import sys
import xml.etree.ElementTree as ET

_SUMMARY = re.compile(r"^(//\S+)\s+(\(cached\)\s+)?(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)\b")


@dataclasses.dataclass(frozen=True)
class Target:
    """One test target's figures."""

    label: str
    wall_s: float
    tests: int
    processes: int | None
    train_processes: int | None
    cached: bool = False
    status: str = ""
    cpu_s: float | None = None
    tensorflow_processes: int | None = None


def read_target(label: str, xml: pathlib.Path) -> Target | None:
    """The figures of `label` from its test.xml; None when the file is missing or unreadable."""
    try:
        root = ET.parse(xml).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    if not suites:
        return None
    props: dict[str, str] = {}
    tests = 0
    suite_time = 0.0
    for suite in suites:
        tests += int(suite.get("tests", 0))
        suite_time += float(suite.get("time", 0) or 0)
        for prop in suite.iter("property"):
            props.setdefault(prop.get("name", ""), prop.get("value", ""))
    wall = float(props["wall_s"]) if "wall_s" in props else suite_time

    def count(name: str) -> int | None:
        return int(props[name]) if name in props else None

    cpu = float(props["cpu_s"]) if "cpu_s" in props else None
    return Target(
        label,
        wall,
        tests,
        count("processes"),
        count("train_processes"),
        cpu_s=cpu,
        tensorflow_processes=count("tensorflow_processes"),
    )


def label_of(testlogs: pathlib.Path, xml: pathlib.Path) -> str:
    package = xml.parent.parent.relative_to(testlogs).as_posix()
    return f"//{package}:{xml.parent.name}"


def collect(testlogs: pathlib.Path, log: pathlib.Path | None = None) -> list[Target]:
    """Every target's figures: those in `log`'s summary when given, else every test.xml found."""
    if log is None:
        found = [read_target(label_of(testlogs, x), x) for x in sorted(testlogs.rglob("test.xml"))]
        return [t for t in found if t is not None]
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = _SUMMARY.match(line.strip())
        if not m:
            continue
        label, cached, status = m.group(1), bool(m.group(2)), m.group(3)
        package, name = label[2:].split(":", 1)
        t = read_target(label, testlogs / package / name / "test.xml")
        if t is None:
            t = Target(label, 0.0, 0, None, None)
        out.append(dataclasses.replace(t, cached=cached, status=status))
    return out


def _n(v: int | None) -> str:
    return "-" if v is None else str(v)


def table(targets: list[Target], top: int | None, markdown: bool = False) -> str:
    """The slowest `top` targets, then the totals (of all targets, and of those run now)."""
    ranked = sorted(targets, key=lambda t: -t.wall_s)
    shown = ranked[:top] if top else ranked
    rows = [("target", "wall s", "tests", "processes", "train runs", "cpu s", "TF procs", "")]
    for t in shown:
        note = " ".join(x for x in ("cached" if t.cached else "", t.status if t.status not in ("", "PASSED") else ""))
        cpu = "-" if t.cpu_s is None else f"{t.cpu_s:.1f}"
        rows.append(
            (
                t.label,
                f"{t.wall_s:.1f}",
                str(t.tests),
                _n(t.processes),
                _n(t.train_processes),
                cpu,
                _n(t.tensorflow_processes),
                note.strip(),
            )
        )
    total = sum(t.wall_s for t in targets)
    run_now = [t for t in targets if not t.cached]
    procs = sum(t.processes or 0 for t in targets)
    trains = sum(t.train_processes or 0 for t in targets)
    rows.append(
        (
            f"total ({len(targets)} targets)",
            f"{total:.1f}",
            str(sum(t.tests for t in targets)),
            str(procs),
            str(trains),
            f"{sum(t.cpu_s or 0 for t in targets):.1f}",
            str(sum(t.tensorflow_processes or 0 for t in targets)),
            "",
        )
    )
    if len(run_now) != len(targets):
        rows.append(
            (f"run now ({len(run_now)} targets)", f"{sum(t.wall_s for t in run_now):.1f}", "", "", "", "", "", "")
        )
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths))).rstrip()
        for r in rows
    )


def child_processes(testlogs: pathlib.Path, labels: list[str]) -> list[dict]:
    """The child processes of `labels` (from the `processes.jsonl` pytest_main keeps in each
    target's `test.outputs/outputs.zip`): `{"target", "argv", "cpu_s", "tensorflow"}`, those that
    did not exit normally with `cpu_s` None."""
    import zipfile

    out = []
    for label in labels:
        package, name = label[2:].split(":", 1)
        archive = testlogs / package / name / "test.outputs" / "outputs.zip"
        try:
            with zipfile.ZipFile(archive) as z:
                lines = z.read("processes.jsonl").decode("utf-8", errors="replace").splitlines()
        except (OSError, KeyError, zipfile.BadZipFile):
            continue
        latest: dict[int, dict] = {}  # pid -> the last process started with it (pids are reused)
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("exit") and record.get("pid") in latest:
                latest[record["pid"]].update(cpu_s=record.get("cpu_s"), tensorflow=bool(record.get("tensorflow")))
            elif "argv" in record:
                latest[record.get("pid")] = {"target": label, "argv": record["argv"], "cpu_s": None, "tensorflow": None}
                out.append(latest[record.get("pid")])
    return out


def _command(argv: list[str], width: int = 90) -> str:
    """A child's command line, shortened: the module or script and its arguments, paths cut to
    their last part."""
    words = [a for a in argv[1:] if a not in ("-u", "-B")]
    words = [w.rsplit("=", 1)[0] + "=" + w.rsplit("/", 1)[-1] if "=/" in w else w.rsplit("/", 1)[-1] for w in words]
    text = " ".join(words)
    return text if len(text) <= width else text[: width - 3] + "..."


def children_table(children: list[dict], top: int) -> str:
    """The `top` costliest child processes by CPU, then how many there were and their CPU sum."""
    timed = sorted((c for c in children if c["cpu_s"] is not None), key=lambda c: -c["cpu_s"])
    lines = [f"{'cpu s':>7}  TF  {'target':<48} command"]
    for c in timed[:top]:
        lines.append(
            f"{c['cpu_s']:7.1f}  {'y' if c['tensorflow'] else '-':>2}  {c['target']:<48} {_command(c['argv'])}"
        )
    tf = sum(1 for c in timed if c["tensorflow"])
    lines.append(
        f"{len(children)} child processes, {len(timed)} exited normally: {sum(c['cpu_s'] for c in timed):.1f} s of "
        f"CPU, {tf} imported TensorFlow"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("testlogs", nargs="?", default="bazel-testlogs")
    parser.add_argument("--top", type=int, default=0, help="print only the N slowest targets")
    parser.add_argument("--log", help="a `bazel test` log: count only the targets of its summary")
    parser.add_argument("--json", help="also write every target's figures to this file")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    parser.add_argument("--children", type=int, default=0, help="also the N costliest child processes by CPU")
    args = parser.parse_args(argv)
    testlogs = pathlib.Path(args.testlogs)
    if not testlogs.is_dir():
        print(f"test_times: no test logs at {testlogs}", file=sys.stderr)
        return 2
    targets = collect(testlogs, pathlib.Path(args.log) if args.log else None)
    if not targets:
        print(f"test_times: no test.xml under {testlogs}", file=sys.stderr)
        return 2
    print(table(targets, args.top or None, args.markdown))
    if args.children:
        print()
        print(children_table(child_processes(testlogs, [t.label for t in targets]), args.children))
    if args.json:
        pathlib.Path(args.json).write_text(
            json.dumps([dataclasses.asdict(t) for t in sorted(targets, key=lambda t: t.label)], indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
