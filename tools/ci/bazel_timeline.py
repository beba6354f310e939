"""Where `bazel test`'s wall time went, from Bazel's JSON trace profile (`command.profile.gz`).

    python3 tools/ci/bazel_timeline.py PROFILE [--jobs 2]

Prints the actions that are not tests and took over 5 s (the standard runs' genrule), when the
first test started and the last ended, and how much of the machine the actions kept busy:
`jobs` slots over the span of the build, against the sum of the actions' times. The idle
slot-seconds at the end (fewer actions running than slots, until the last one ends) are the
tail that a long test started late leaves. `.ci/run` copies the profile right after
`./bazelw test` (a later Bazel command writes its own) and prints this after the test times.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Action:
    name: str
    start_s: float
    end_s: float

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


def read_actions(profile: pathlib.Path) -> list[Action]:
    """The profile's executed actions ("action processing" events), in seconds from its start."""
    opener = gzip.open if profile.suffix == ".gz" else open
    with opener(profile, "rt", encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    t0 = min((e["ts"] for e in events if "ts" in e), default=0)
    actions = [
        Action(str(e.get("name", "")), (e["ts"] - t0) / 1e6, (e["ts"] + e.get("dur", 0) - t0) / 1e6)
        for e in events
        if e.get("cat") == "action processing" and "ts" in e
    ]
    return sorted(actions, key=lambda a: (a.start_s, a.name))


def busy_profile(actions: list[Action]) -> list[tuple[float, int]]:
    """`(time, running)` at every point where the number of running actions changes."""
    points = sorted([(a.start_s, 1) for a in actions] + [(a.end_s, -1) for a in actions])
    out: list[tuple[float, int]] = []
    running = 0
    for t, d in points:
        running += d
        if out and out[-1][0] == t:
            out[-1] = (t, running)
        else:
            out.append((t, running))
    return out


def summary(actions: list[Action], jobs: int) -> dict:
    """The figures `main` prints: span, busy and idle slot-seconds, the tail, the long builds."""
    if not actions:
        return {"span_s": 0.0, "busy_s": 0.0, "idle_slot_s": 0.0, "tail_idle_slot_s": 0.0, "builds": [], "tests": 0}
    start = min(a.start_s for a in actions)
    end = max(a.end_s for a in actions)
    busy = sum(a.seconds for a in actions)
    tail_idle = 0.0
    profile = busy_profile(actions)
    # Walk back from the end while fewer actions than slots run: the tail.
    for (t, running), (t_next, _) in zip(reversed(profile[:-1]), reversed(profile[1:]), strict=True):
        if running >= jobs:
            break
        tail_idle += (jobs - running) * (t_next - t)
    tests = [a for a in actions if a.name.startswith("Testing ")]
    builds = [a for a in actions if not a.name.startswith("Testing ") and a.seconds > 5]
    return {
        "span_s": end - start,
        "busy_s": busy,
        "idle_slot_s": max(0.0, jobs * (end - start) - busy),
        "tail_idle_slot_s": tail_idle,
        "builds": builds,
        "tests": len(tests),
        "first_test_s": min((a.start_s for a in tests), default=0.0),
        "last_test_end_s": max((a.end_s for a in tests), default=0.0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profile", help="Bazel's JSON trace profile (command.profile.gz)")
    parser.add_argument("--jobs", type=int, default=2, help="action slots (Bazel's --jobs; the cores)")
    args = parser.parse_args(argv)
    try:
        actions = read_actions(pathlib.Path(args.profile))
    except (OSError, ValueError, KeyError) as e:
        print(f"bazel_timeline: cannot read {args.profile}: {e}", file=sys.stderr)
        return 2
    s = summary(actions, args.jobs)
    for b in s["builds"]:
        print(f"{b.name[:70]:70} {b.start_s:7.1f} -> {b.end_s:7.1f} s ({b.seconds:.1f} s)")
    if s["tests"]:
        first, last = s["first_test_s"], s["last_test_end_s"]
        print(f"{s['tests']} test actions: the first started at {first:.1f} s, the last ended at {last:.1f} s")
    print(
        f"span {s['span_s']:.1f} s x {args.jobs} slots; actions {s['busy_s']:.1f} s; idle slot-seconds "
        f"{s['idle_slot_s']:.1f}, of which {s['tail_idle_slot_s']:.1f} in the tail"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
