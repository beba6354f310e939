"""TFDS split slicing: `train[:90%]`, `train[10%:]`, `train[:1000]`, `train[-5%:]`,
`train[:2shard]`, and `+` joining parts (`train[:10%]+validation`), with TFDS's semantics.

A part is a split name with an optional `[from:to]` slice. A boundary is an integer (an example
count), a percentage (`%`, -100..100), or a shard count (`shard`); both boundaries of one slice use
the same unit. Negative boundaries count from the end. Percentages round to the closest example,
as TFDS does by default (`round(boundary * num_examples / 100)`, Python's rounding). Boundaries
are clamped to the split; the examples of a part are those of its files, in file order, from
`from` up to (not including) `to`.

`resolve(spec, lengths)` turns a spec into per-file windows `(split, file, skip, take)` given the
example count of every file of every split (TFDS's `shardLengths`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from cairn.datatasks.errors import DataTasksError

_PART = re.compile(r"^(?P<name>[\w\-.]+)(?:\[(?P<from>[^:\]]*):(?P<to>[^:\]]*)\])?$")
_BOUNDARY = re.compile(r"^(?P<value>-?\d+)(?P<unit>%|shard)?$")


@dataclasses.dataclass(frozen=True)
class SplitPart:
    """One `name[from:to]` part; `unit` is "abs", "%" or "shard"; None boundaries are open."""

    name: str
    start: int | None = None
    stop: int | None = None
    unit: str = "abs"


@dataclasses.dataclass(frozen=True)
class FileWindow:
    """Examples `[skip, skip + take)` of file `file` (its index in the split's file order) of
    `split`, for the spec's part number `part`."""

    part: int
    split: str
    file: int
    skip: int
    take: int


def _boundary(spec: str, text: str) -> tuple[int | None, str | None]:
    text = text.strip()
    if not text:
        return None, None
    m = _BOUNDARY.match(text)
    if m is None:
        raise DataTasksError(
            f"split {spec!r}: cannot parse the slice boundary {text!r} (an integer, a percentage like 90%, or 2shard)"
        )
    unit = m.group("unit") or "abs"
    value = int(m.group("value"))
    if unit == "%" and not -100 <= value <= 100:
        raise DataTasksError(f"split {spec!r}: percentage {value}% is outside -100%..100%")
    return value, unit


def parse(spec: str) -> list[SplitPart]:
    """The parts of a split spec; `DataTasksError` naming the spec when it does not parse."""
    if not isinstance(spec, str) or not spec.strip():
        raise DataTasksError(f"split spec must be a non-empty string, got {spec!r}")
    parts = []
    for text in spec.split("+"):
        m = _PART.match(text.strip())
        if m is None:
            raise DataTasksError(
                f"split {spec!r}: cannot parse {text.strip()!r} (expected name or name[from:to], e.g. train[:90%])"
            )
        if m.group("from") is None:
            parts.append(SplitPart(m.group("name")))
            continue
        start, u1 = _boundary(spec, m.group("from"))
        stop, u2 = _boundary(spec, m.group("to"))
        if u1 and u2 and u1 != u2:
            raise DataTasksError(
                f"split {spec!r}: both boundaries of a slice must use the same unit, got {u1} and {u2}"
            )
        parts.append(SplitPart(m.group("name"), start, stop, u1 or u2 or "abs"))
    return parts


def _absolute(part: SplitPart, lengths: Sequence[int]) -> tuple[int, int]:
    """`[from, to)` in examples of the part's split (TFDS's `_rel_to_abs_instr`, closest rounding)."""
    n = sum(lengths)

    def convert(value: int | None, default: int) -> int:
        if value is None:
            return default
        if part.unit == "%":
            value = int(round(value * n / 100.0))
        elif part.unit == "shard":
            if not -len(lengths) <= value <= len(lengths):
                raise DataTasksError(
                    f"split {part.name!r}: shard boundary {value} outside the split's {len(lengths)} shards"
                )
            value = sum(lengths[:value])
        if value < 0:
            value = max(n + value, 0)
        return min(value, n)

    return convert(part.start, 0), convert(part.stop, n)


def is_sliced(spec: str) -> bool:
    """Whether `spec` is more than a plain split name."""
    parts = parse(spec)
    return len(parts) > 1 or parts[0].start is not None or parts[0].stop is not None


def resolve(spec: str, lengths: Mapping[str, Sequence[int]]) -> list[FileWindow]:
    """Per-file windows of `spec` in read order (files of a part in order, parts in order),
    given `lengths[split]`, the example counts of the split's files. Files a part does not
    touch are left out; a spec naming an unknown split, or selecting no example, is an error."""
    windows: list[FileWindow] = []
    for index, part in enumerate(parse(spec)):
        if part.name not in lengths:
            raise DataTasksError(f"split {spec!r}: no split {part.name!r} (known: {sorted(lengths)})")
        files = list(lengths[part.name])
        start, stop = _absolute(part, files)
        offset = 0
        for i, count in enumerate(files):
            lo, hi = max(start, offset), min(stop, offset + count)
            if hi > lo:
                windows.append(FileWindow(index, part.name, i, lo - offset, hi - lo))
            offset += count
    if not windows:
        raise DataTasksError(f"split {spec!r} selects no example")
    return windows
