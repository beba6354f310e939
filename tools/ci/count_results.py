#!/usr/bin/env python3
"""Counts test cases from a `bazel test` run: reads the summary lines of its log and the
JUnit XML that each test target wrote, and prints `N passed, N failed[, N skipped]`.

A target that failed without XML (build failure, crash before pytest started) counts as
one failed test. Exit status: 0 if nothing failed, 1 otherwise.

Usage: count_results.py BAZEL_LOG TESTLOGS_DIR
"""

import pathlib
import re
import sys
import xml.etree.ElementTree as ET

_SUMMARY = re.compile(
    r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS|FAILED TO BUILD|INCOMPLETE|REMOTE FAILURE)\b"
)


def main(log_path: str, testlogs: str) -> int:
    passed = failed = skipped = 0
    targets = []
    for line in pathlib.Path(log_path).read_text(errors="replace").splitlines():
        m = _SUMMARY.match(line.strip())
        if m:
            targets.append((m.group(1), m.group(2)))
    for label, status in targets:
        package, name = label[2:].split(":", 1)
        xml = pathlib.Path(testlogs, package, name, "test.xml")
        counted = False
        if xml.exists() and status in ("PASSED", "FAILED", "FLAKY"):
            root = ET.parse(xml).getroot()
            suites = [root] if root.tag == "testsuite" else root.iter("testsuite")
            for suite in suites:
                n = int(suite.get("tests", 0))
                bad = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
                skip = int(suite.get("skipped", 0))
                passed += n - bad - skip
                failed += bad
                skipped += skip
                counted = counted or n > 0
        if status != "PASSED" and status != "FLAKY":
            if not counted or status in ("TIMEOUT", "NO STATUS", "INCOMPLETE"):
                failed += 1
            print(f"not passed: {label} ({status})")
    if not targets:
        print("no test target ran")
        failed += 1
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
