"""Where a step's device time goes: a `jax.profiler` trace, summed per op class.

`profile_steps(step, n, trace_dir)` traces `n` calls of `step()` and `op_classes(trace_dir)`
reads the trace back with `jax.profiler.ProfileData` (no TensorBoard or xprof needed) and
returns the device time per class: on a TPU the ops of the "XLA Ops" lines of `/device:*`
planes, grouped by their `hlo_category` stat (convolution fusion, loop fusion, custom-call for
Pallas kernels, data formatting, all-reduce, ...) where the trace has it, else by the op's name
with its numeric suffix removed. On a CPU, where XLA ops run on the host client's threads, the
events that carry an `hlo_op` stat are used, so the same code is checked without a chip.
"""

from __future__ import annotations

import collections
import glob
import os
import re
from collections.abc import Callable

import jax

_SUFFIX = re.compile(r"[._]\d+$")


def profile_steps(step: Callable[[], object], n: int, trace_dir: str) -> str:
    """Runs `step()` `n` times under `jax.profiler.trace(trace_dir)`, waiting for each result;
    returns the `.xplane.pb` file written."""
    with jax.profiler.trace(trace_dir):
        for _ in range(n):
            jax.block_until_ready(step())
    return latest_trace(trace_dir)


def latest_trace(trace_dir: str) -> str:
    """The newest `.xplane.pb` under `trace_dir` (where `jax.profiler` writes a trace)."""
    files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
    if not files:
        raise RuntimeError(f"jax.profiler wrote no .xplane.pb under {trace_dir}")
    return files[-1]


_KIND = re.compile(r"kind=(k\w+)")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_OPNAME = re.compile(r"^%?([A-Za-z_\-]+?)(?:[._]\d+)*(?:\.clone(?:\.\d+)?)?(?: =|$)")
_KIND_CLASS = {"kOutput": "matmul fusion", "kLoop": "elementwise fusion", "kInput": "reduction fusion"}


def _op_class(name: str, stats: dict) -> str:
    """A class for one device op: the trace's `hlo_category` where it has one; else read off the
    op's HLO text (a TPU names each op by it): custom calls by target (Pallas kernels are
    `tpu_custom_call`), fusions by kind (an output fusion holds a matmul), copies and
    collectives by op name."""
    category = stats.get("hlo_category")
    if category:
        return str(category)
    text = str(stats.get("hlo_op", name))
    target = _TARGET.search(text)
    if target:
        return f"custom-call {target.group(1)}"
    kind = _KIND.search(text)
    if kind:
        return _KIND_CLASS.get(kind.group(1), kind.group(1))
    op = _OPNAME.match(text.strip())
    op_name = op.group(1) if op else _SUFFIX.sub("", text.split(" ")[0])
    if op_name.endswith("-start") or op_name.endswith("-done"):
        return f"async {op_name.rsplit('-', 1)[0]}"
    if op_name in ("convolution", "dot"):
        return "matmul"
    return op_name


def _leaves(events) -> list:
    """The events of one line that contain no other (a `while` loop's event spans its body's
    ops: counting both would count the body twice)."""
    events = sorted(events, key=lambda e: (e.start_ns, -e.end_ns))
    leaves = []
    for i, event in enumerate(events):
        following = events[i + 1] if i + 1 < len(events) else None
        if following is not None and following.start_ns < event.end_ns and following.end_ns <= event.end_ns:
            continue  # it contains the next event
        leaves.append(event)
    return leaves


def op_classes(xplane_file: str, top_ops: int = 15, tags: dict | None = None) -> dict:
    """`{"classes": {class: ms}, "tags": {tag: ms}, "ops": {op: ms} (the `top_ops` longest),
    "total_ms"}`: device time summed over the trace (divide by the steps traced for a per-step
    figure). `tags` maps a name to a regular expression: an op whose HLO text matches it (say, a
    tensor shape of attention logits) counts towards that tag as well as its class; the first
    matching tag wins."""
    tag_res = [(tag, re.compile(pattern)) for tag, pattern in (tags or {}).items()]
    tagged: collections.Counter = collections.Counter()

    def tag_of(text: str) -> str | None:
        return next((tag for tag, rx in tag_res if rx.search(text)), None)

    data = jax.profiler.ProfileData.from_file(xplane_file)
    device_planes = [p for p in data.planes if p.name.startswith("/device:")]
    classes: collections.Counter = collections.Counter()
    ops: collections.Counter = collections.Counter()
    if device_planes:
        for plane in device_planes:
            lines = list(plane.lines)
            op_lines = [line for line in lines if line.name == "XLA Ops"] or lines
            for line in op_lines:
                for event in _leaves(line.events):
                    stats = dict(event.stats)
                    classes[_op_class(event.name, stats)] += event.duration_ns
                    ops[event.name] += event.duration_ns
                    tagged[tag_of(event.name) or "other"] += event.duration_ns
    else:  # a CPU: the host client's threads run the ops, each event naming its HLO op
        for plane in data.planes:
            for line in plane.lines:
                for event in line.events:
                    stats = dict(event.stats)
                    if "hlo_op" in stats and not event.name.startswith("end:"):
                        classes[_op_class(event.name, stats)] += event.duration_ns
                        ops[str(stats["hlo_op"])] += event.duration_ns
                        tagged[tag_of(str(stats["hlo_op"])) or "other"] += event.duration_ns
    total = sum(classes.values())
    return {
        "total_ms": total / 1e6,
        "classes": {k: v / 1e6 for k, v in classes.most_common()},
        "tags": {k: v / 1e6 for k, v in tagged.most_common()} if tag_res else {},
        "ops": {k: v / 1e6 for k, v in ops.most_common(top_ops)},
    }


def format_op_classes(profile: dict, steps: int) -> str:
    """A Markdown table of ms per step and share of device time, per class."""
    total = profile["total_ms"] or 1.0
    rows = ["| op class | ms / step | share |", "|---|---|---|"]
    for name, ms in profile["classes"].items():
        rows.append(f"| {name} | {ms / steps:.2f} | {100 * ms / total:.1f} % |")
    for name, ms in profile.get("tags", {}).items():
        rows.append(f"| tensors: {name} | {ms / steps:.2f} | {100 * ms / total:.1f} % |")
    rows.append(f"| total | {profile['total_ms'] / steps:.2f} | 100 % |")
    return "\n".join(rows)
