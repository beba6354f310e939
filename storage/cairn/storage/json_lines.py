"""Append-only JSON-lines files that work on a bucket too.

A local file is appended to (a truncated last line left by a kill is cut first, so new rows
start on a fresh line). An object store cannot append, so at a URL `path` each flush writes
one whole object `<path>.parts/<n>.jsonl` (n = 0, 1, ...: the next free number, found by one
listing when the writer opens; one writer per file, which the model_dir lock guarantees).
A part is never torn: it is one upload. `read_json_lines` reads both forms, in order.

`supersede_after(path, step, aside)` keeps one history when a run resumes from a checkpoint at
`step`: the rows after it (the discarded timeline's) move to `aside`, locally by one atomic
rewrite of the file, at a URL part by part (each part rewritten whole or removed).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from cairn.storage.atomic import read_bytes, write_bytes
from cairn.storage.exclusive import remove
from cairn.storage.paths import PathLike, is_url, join, sizes

log = logging.getLogger(__name__)
PARTS_SUFFIX = ".parts"


def _parts(path: str) -> list[str]:
    names = [n for n in sizes(path + PARTS_SUFFIX) if n.endswith(".jsonl") and n[:-6].isdigit()]
    return [join(path + PARTS_SUFFIX, n) for n in sorted(names, key=lambda n: int(n[:-6]))]


def _trim_partial_line(path: str) -> None:
    """Cuts a truncated last line (a kill mid-write) off a local file."""
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return
    if size == 0:
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        log.warning("%s: dropping a truncated last line (%d bytes)", path, len(data) - cut)
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())


class JsonLinesWriter:
    """Rows (JSON objects) appended to `path`, local or URL.

    `append(rows)` writes at once locally (`fsync=True`: flushed to disk too); at a URL rows
    are buffered until `flush()` (or `append(..., flush=True)`), each flush one new part."""

    def __init__(self, path: PathLike, fsync: bool = False):
        self.path = os.fspath(path)
        self.remote = is_url(self.path)
        self.fsync = fsync
        self._buffer: list[str] = []
        if self.remote:
            existing = _parts(self.path)
            self._next = int(existing[-1].rsplit("/", 1)[-1][:-6]) + 1 if existing else 0
        else:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            _trim_partial_line(self.path)

    def append(self, rows: Iterable[Mapping[str, Any]], flush: bool = False, **dumps_kwargs: Any) -> None:
        dumps_kwargs.setdefault("sort_keys", True)
        lines = [json.dumps(row, **dumps_kwargs) + "\n" for row in rows]
        if not lines:
            if flush:
                self.flush()
            return
        if self.remote:
            self._buffer.extend(lines)
            if flush:
                self.flush()
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(lines))
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())

    def flush(self) -> None:
        """At a URL: writes the buffered rows as one part (nothing when none are buffered)."""
        if not self.remote or not self._buffer:
            return
        data = "".join(self._buffer).encode("utf-8")
        write_bytes(join(self.path + PARTS_SUFFIX, f"{self._next:08d}.jsonl"), data)
        self._next += 1
        self._buffer.clear()

    def close(self) -> None:
        self.flush()


def _rows(text: str, tolerate_last: bool) -> tuple[list[dict], int]:
    lines = text.split("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    rows, bad = [], 0
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not an object")
        except ValueError:
            if not (tolerate_last and i == last):
                bad += 1
            continue
        rows.append(row)
    return rows, bad


def read_json_lines(path: PathLike) -> tuple[list[dict], int]:
    """`(rows, bad)`: the rows of `path` (the local file, then its parts in order); `bad`
    counts unreadable lines other than a truncated last line of the local file."""
    s = os.fspath(path)
    rows: list[dict] = []
    bad = 0
    if not is_url(s) and os.path.exists(s):
        with open(s, encoding="utf-8", errors="replace") as f:
            rows, bad = _rows(f.read(), tolerate_last=True)
    for part in _parts(s):
        more, more_bad = _rows(read_bytes(part).decode("utf-8", errors="replace"), tolerate_last=False)
        rows += more
        bad += more_bad
    return rows, bad


SUPERSEDED_KEY = "superseded_after_step"  # added to each row `supersede_after` moves aside


def _late_step(line: str, step: int) -> dict | None:
    """The row on `line` when its "step" is after `step` (else None: kept as it is)."""
    try:
        row = json.loads(line)
        return row if isinstance(row, dict) and int(row.get("step", -1)) > step else None
    except (ValueError, TypeError):
        return None


def _split(text: str, step: int) -> tuple[str, list[dict]]:
    kept, late = [], []
    for line in text.splitlines(keepends=True):
        row = _late_step(line, step) if line.strip() else None
        if row is None:
            kept.append(line)
        else:
            late.append({**row, SUPERSEDED_KEY: step})
    return "".join(kept), late


def _ends_by(source: str, step: int) -> bool:
    """Whether the last row of `source` has a "step" of at most `step`. Rows are appended in
    step order, so then no row is after `step`: a start reads the file's tail only, not the
    whole history."""
    if is_url(source):
        text = read_bytes(source).decode("utf-8", errors="replace")
    else:
        with open(source, "rb") as f:
            f.seek(max(0, os.path.getsize(source) - (64 << 10)))
            text = f.read().decode("utf-8", errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        return int(json.loads(lines[-1])["step"]) <= step if lines else True
    except (ValueError, TypeError, KeyError, IndexError):
        return False  # not a row with a step: look at every row


def supersede_after(path: PathLike, step: int, aside: PathLike) -> int:
    """Moves the rows of `path` (the local file and its parts) whose "step" is after `step` to
    `aside` (appended, each with `SUPERSEDED_KEY: step`), so readers of `path` see one history
    when a run resumes at `step`. Rows without a step, and unreadable lines, stay. The rows are
    written to `aside` first, then `path` (or each part holding such rows) is replaced whole;
    a kill in between leaves them in both, and the next resume moves them again. Returns the
    number of rows moved."""
    s = os.fspath(path)
    moved = 0
    sources = ([s] if not is_url(s) and os.path.exists(s) else []) + _parts(s)
    if not sources or _ends_by(sources[-1], step):
        return 0
    for source in sources:
        text = read_bytes(source).decode("utf-8", errors="replace")
        kept, late = _split(text, step)
        if not late:
            continue
        writer = JsonLinesWriter(aside)
        writer.append(late, flush=True)
        writer.close()
        if kept.strip() or source == s:
            write_bytes(source, kept.encode("utf-8"))
        else:  # a part with nothing left
            remove(source)
        moved += len(late)
    return moved
