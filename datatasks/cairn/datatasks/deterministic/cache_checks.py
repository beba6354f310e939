"""A task cache checked against its task when it is opened: the cache holds this task and split
as the task is now (its fingerprint, its source), and its files are all there with their recorded
sizes. Opening reads only metadata; reading every byte again is `verify.verify_cache`'s job."""

from __future__ import annotations

from typing import Any

from cairn.datatasks.deterministic import fingerprint as fp
from cairn.datatasks.deterministic.store import (
    LENGTHS,
    CacheIntegrityError,
    CacheMismatchError,
    clear_hint,
    file_size,
    list_sizes,
    verify_hint,
)


def check_task(info: dict, path: str, task: Any, split: str, check_source_files: bool) -> None:
    """A `CacheMismatchError` unless the cache at `path` (its `info.json`: `info`) holds `task`'s
    `split` as the task is now: the task's fingerprint parts, and with `check_source_files` its
    source (the code behind it, or the listed files' names and sizes)."""
    if info.get("task") != task.name or info.get("split") != split:
        raise CacheMismatchError(
            f"cache {path!r} holds task {info.get('task')!r} split "
            f"{info.get('split')!r}, not task {task.name!r} split {split!r}"
        )
    cached = info["fingerprint"]
    current = dict(fp.task_fingerprint(task, split, with_source=False), source=cached.get("source"))
    file_source = fp.is_file_source(task.source)
    if check_source_files and not file_source:  # the code behind the source: cheap
        current["source"] = fp.source_digest(fp.source_description(task, split))
    bad = fp.mismatched_parts(cached, current)
    if bad:
        diff = "; ".join(f"{p}: cache {cached.get(p, '')[:12]} vs task {current.get(p, '')[:12]}" for p in bad)
        raise CacheMismatchError(
            f"cache {path!r} does not match task {task.name!r}: the task's "
            f"{', '.join(bad)} changed since it was cached ({diff}); {clear_hint(path)} "
            f"and cache again"
        )
    if check_source_files and file_source:
        listed = {
            "type": type(task.source).__name__,
            "split": split,
            "files": [
                {"pattern": f.pattern, "name": f.name, "size": file_size(f.path)}
                | ({"window": [f.skip, f.take]} if getattr(f, "windowed", False) else {})
                for f in task.source.source_files(split)
            ],
        }
        diff_lines = fp.source_differences(info.get("source", {}), listed, compare_content=False)
        if diff_lines:
            raise CacheMismatchError(
                f"cache {path!r} does not match the source files of task "
                f"{task.name!r}: {'; '.join(diff_lines[:5])}"
                f"{f' (and {len(diff_lines) - 5} more)' if len(diff_lines) > 5 else ''}; "
                f"{clear_hint(path)} and cache again (check_source_files=False reads "
                f"the cache as it is)"
            )


def check_files(info: dict, path: str, name: str | None, split: str) -> None:
    """A `CacheIntegrityError` unless every shard, the lengths and the chunk index are present
    with their recorded sizes (one listing)."""
    sizes = list_sizes(path)
    expected = [(s["file"], int(s["bytes"])) for s in info["shards"]]
    expected.append((LENGTHS, int(info["lengths"]["bytes"])))
    if info.get("chunks"):  # format 4's chunk index
        expected.append((info["chunks"]["file"], int(info["chunks"]["bytes"])))
    problems = []
    for file, want in expected:
        got = sizes.get(file)
        if got is None:
            problems.append(f"{file} is missing")
        elif got != want:
            problems.append(f"{file} has {got} bytes, info.json recorded {want} (truncated or replaced)")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise CacheIntegrityError(
            f"cache {path!r} is damaged: {'; '.join(problems[:5])}{more}; "
            f"{verify_hint(path, name, split)}, then re-cache ({clear_hint(path)})"
        )
