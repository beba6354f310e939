"""`verify_cache`: the explicit, full check of a task cache (every byte, every source file).

Opening a cache (`cached_task.CachedTask`) reads metadata only: it trusts the checksums and the
source fingerprint that the cache writer recorded. `verify_cache` reads everything again:
it re-hashes every shard, `lengths.npy` and `chunks.npy` against the SHA-256 in `info.json`, and every
stored packing plan's arrays against their records (`plan_store`), and
fingerprints the task's source files again against the recorded ones, and names what
differs: a shard file, a source file (by its name relative to its pattern's root), a
fingerprint part. Its cost is one read of the cache and of the sources.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cairn.datatasks.deterministic import fingerprint as fp
from cairn.datatasks.deterministic import plan_store, store
from cairn.datatasks.errors import DataTasksError
from cairn.datatasks.registry import DEFAULT_REGISTRY, Registry


def resolve(tasks: str | Any | Sequence[Any], registry: Registry | None = None) -> list[Any]:
    """Tasks from a `Task`, a list of tasks or names, a registered task or mixture name, or
    a regex over registered task names."""
    from cairn.datatasks.deterministic.cache_job import resolve_tasks
    from cairn.datatasks.mixture import Mixture

    registry = registry or DEFAULT_REGISTRY
    if isinstance(tasks, str):
        if tasks in registry:
            obj = registry.get(tasks)
            return [obj.tasks[n] for n in sorted(obj.tasks)] if isinstance(obj, Mixture) else [obj]
        return resolve_tasks(tasks, registry)
    if isinstance(tasks, (list, tuple)):
        return resolve_tasks(list(tasks), registry)
    return [tasks]


def _shard_problems(path: str, info: dict) -> list[str]:
    problems = []
    sizes = store.list_sizes(path)
    expected = [(s["file"], s["bytes"], s["sha256"]) for s in info["shards"]]
    expected.append((store.LENGTHS, info["lengths"]["bytes"], info["lengths"]["sha256"]))
    if info.get("chunks"):  # format 4's chunk index
        expected.append((info["chunks"]["file"], info["chunks"]["bytes"], info["chunks"]["sha256"]))
    for name, size, sha in expected:
        if name not in sizes:
            problems.append(f"{name}: missing")
            continue
        got_size, got_sha = fp.file_digest(store.join(path, name))
        if got_size != size:
            problems.append(f"{name}: {got_size} bytes, info.json recorded {size} (truncated or replaced)")
        elif got_sha != sha:
            problems.append(
                f"{name}: content differs from info.json (sha256 {got_sha[:12]}, "
                f"recorded {sha[:12]}): the file is corrupt"
            )
    return problems


def _plan_problems(path: str) -> list[str]:
    """The stored packing plans (`plans/`, `plan_store`): every array of every plan re-hashed
    against its record. A damaged plan is harmless to delete: the next reader builds it again."""
    folder = store.join(path, plan_store.PLANS)
    sizes = store.list_sizes(folder)
    problems = []
    hint = f"delete {folder} (plans are rebuilt on the next start)"
    for record_name in sorted(n for n in sizes if n.endswith(".json")):
        try:
            record = store.read_json(store.join(folder, record_name))
            arrays = sorted(record["arrays"].items())
        except (ValueError, KeyError, TypeError, AttributeError):
            problems.append(f"{plan_store.PLANS}/{record_name}: unreadable; {hint}")
            continue
        for _, meta in arrays:
            name = f"{plan_store.PLANS}/{meta['file']}"
            if meta["file"] not in sizes:
                problems.append(f"{name}: missing; {hint}")
                continue
            got_size, got_sha = fp.file_digest(store.join(folder, meta["file"]))
            if got_size != int(meta["bytes"]) or got_sha != meta["sha256"]:
                problems.append(f"{name}: differs from its record {record_name} (corrupt); {hint}")
    return problems


def _source_problems(task: Any, split: str, info: dict) -> list[str]:
    recorded = info.get("source", {})
    if fp.source_digest(recorded) != info["fingerprint"].get("source"):
        return ["info.json: the recorded source files do not match the recorded source fingerprint (info.json edited?)"]
    try:
        current = fp.source_description(task, split)
    except (DataTasksError, OSError) as e:
        return [f"source: cannot read the task's source files: {e}"]
    lines = fp.source_differences(recorded, current)
    if not lines and fp.source_digest(current) != info["fingerprint"].get("source"):
        lines.append("source: fingerprint differs (the source's description changed)")
    return lines


def verify_task_cache(path: str, task: Any, split: str = "train") -> list[str]:
    """The problems of the cache at `path` for `task`/`split`, one line each (empty: all
    match)."""
    state = store.cache_state(path)
    if state == "missing":
        return [f"no cache at {path}"]
    if state == "incomplete":
        return [f"{store.COMPLETED} missing: the cache is incomplete or still being written"]
    if state == "outdated":
        return [
            f"written in format {store.format_version(path)}; this version reads formats "
            f"{', '.join(map(str, store.READABLE_FORMATS))}: re-cache it (--overwrite)"
        ]
    info = store.read_json(store.join(path, store.INFO))
    problems = []
    if info.get("task") != task.name or info.get("split") != split:
        problems.append(
            f"info.json: holds task {info.get('task')!r} split {info.get('split')!r}, not {task.name!r} split {split!r}"
        )
    recorded = info["fingerprint"]
    current = fp.task_fingerprint(task, split, with_source=False)
    for part in ("preprocessors", "features", "vocabulary"):
        if recorded.get(part) != current[part]:
            problems.append(
                f"fingerprint: the task's {part} changed since it was cached "
                f"(cache {str(recorded.get(part))[:12]}, task {current[part][:12]})"
            )
    problems += _shard_problems(path, info)
    problems += _plan_problems(path)
    problems += _source_problems(task, split, info)
    return problems


def verify_cache(
    cache_dir: str, tasks: str | Any | Sequence[Any], split: str = "train", registry: Registry | None = None
) -> dict[str, list[str]]:
    """Full verification of the caches of `tasks` under `cache_dir` (every shard re-hashed
    against its recorded SHA-256, every source file fingerprinted again).

    Args:
      tasks: a `Task`, a list of tasks or names, a registered task or mixture name, or a
        regex over registered task names.
    Returns:
      `{task name: [problem, ...]}`; all lists empty when every byte matches.
    """
    return {
        t.name: verify_task_cache(store.task_dir(cache_dir, t.name, split), t, split) for t in resolve(tasks, registry)
    }


def report(results: dict[str, list[str]], split: str, out: Any = None) -> int:
    """Prints `results` (`verify_cache`'s) as `<task>/<split>: ok` or one line per problem;
    returns the exit status of a verify command: 0 when everything matches, else 2."""
    import sys

    out = out or sys.stdout
    bad = 0
    for name, problems in sorted(results.items()):
        if not problems:
            print(f"{name}/{split}: ok", file=out)
        for line in problems:
            print(f"{name}/{split}: {line}", file=out)
        bad += len(problems)
    return 2 if bad else 0
