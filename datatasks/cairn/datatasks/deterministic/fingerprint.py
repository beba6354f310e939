"""The fingerprint of a task definition: what a cache was built from.

Parts (each a SHA-256 hex digest), so a mismatch can say what changed:
  * `preprocessors`: name, source code (or bytecode when the source is unavailable) and
    bound arguments of each *cacheable* preprocessor (those the cache runs);
  * `features`: the output features (name, add_eos, required, dtype, rank);
  * `vocabulary`: each output feature's vocabulary (type and content);
  * `source`: the source's type, split and, for file sources, every file's pattern index,
    name relative to the pattern's root (`sources.pattern_root`: the directory part of the
    pattern before its first glob character), size and SHA-256 of its bytes; never an
    absolute path, so a copy of the sources in another directory (another clone, another
    machine) has the same fingerprint. For other sources: the code of the function behind
    them, or what their `fingerprint_description(split)` gives (`GrainDataSource`).

The cache writer computes the fingerprint once and stores it, with the per-file details,
in `info.json`; a reader compares the cheap parts only (`cached_task.CachedTask`), and
`verify.verify_cache` re-hashes everything.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from cairn.datatasks.preprocessors.base import Preprocessor

PARTS = ("preprocessors", "features", "vocabulary", "source")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=repr).encode()).hexdigest()


def _code(fn: Any) -> str:
    """The source of `fn`, or a description of its bytecode and constants."""
    target = inspect.unwrap(fn) if callable(fn) else fn
    try:
        return inspect.getsource(target)
    except (OSError, TypeError):
        code = getattr(target, "__code__", None)
        if code is None:
            return repr(target)
        return code.co_code.hex() + repr(code.co_consts) + repr(code.co_names)


def _value(v: Any) -> Any:
    """A JSON-able, stable description of an argument value (no ids or addresses)."""
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_value(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _value(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
    if callable(v):
        return {"callable": getattr(v, "__qualname__", type(v).__name__), "code": _code(v)}
    return _ADDRESS.sub("", repr(v))


def preprocessor_description(fn: Callable) -> dict:
    """Name, code and bound arguments of one preprocessor."""
    args: list = []
    kwargs: dict = {}
    while isinstance(fn, (functools.partial, Preprocessor)):
        if isinstance(fn, Preprocessor):  # described by its function: caches stay valid
            fn = fn.fn
            continue
        args = list(fn.args) + args
        kwargs = {**fn.keywords, **kwargs}
        fn = fn.func
    wrapped = getattr(fn, "__wrapped__", None)
    return {
        "name": f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}",
        "code": _code(fn),
        "wrapped_code": _code(wrapped) if wrapped else None,
        "args": _value(args),
        "kwargs": _value(kwargs),
    }


def vocabulary_fingerprint(vocab: Any) -> str:
    fp = getattr(vocab, "fingerprint", None)
    content = vocab._content_key() if hasattr(vocab, "_content_key") else repr(vocab)
    return _digest(
        [type(vocab).__name__, fp if isinstance(fp, str) else None, repr(content), getattr(vocab, "extra_ids", None)]
    )


def file_digest(path: str, chunk: int = 1 << 22) -> tuple[int, str]:
    """`(size, sha256 hex)` of the bytes of one file, read once in large blocks."""
    from cairn.datatasks.deterministic import store

    h = hashlib.sha256()
    size = 0
    with store.open_read(path) as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
            size += len(block)
    return size, h.hexdigest()


def file_fingerprint(file: Any) -> dict:
    """A source file by content and relative name: `{pattern, name, size, sha256}`.

    `file` is a `sources.SourceFile`; `name` is relative to its pattern's root, never the
    absolute path, so a copy of the sources elsewhere has the same fingerprint.
    """
    size, sha = file_digest(file.path)
    out = {"pattern": file.pattern, "name": file.name, "size": size, "sha256": sha}
    if getattr(file, "windowed", False):  # a window of the file's examples (a sliced split)
        out["window"] = [file.skip, file.take]
    return out


def is_file_source(source: Any) -> bool:
    return callable(getattr(source, "source_files", None))


def source_description(task: Any, split: str, files: list[dict] | None = None) -> dict:
    """What the `source` part hashes: for file sources every file (pattern index, relative
    name, size, SHA-256; `files` when already computed, e.g. by the cache workers), for
    other sources the code behind them."""
    source = task.source
    desc: dict = {"type": type(source).__name__, "split": split}
    if is_file_source(source):
        desc["files"] = list(files) if files is not None else [file_fingerprint(f) for f in source.source_files(split)]
        if getattr(source, "decode_fn", None) is not None:  # a proto source's decoder shapes the examples
            desc["code"] = _code(source.decode_fn)
        read = getattr(source, "read_options", None)  # a table source's format and columns
        if read is not None:
            desc["read"] = _value(read)
    else:
        desc["shards"] = source.list_shards(split)
        fn = getattr(source, "_fn", None)
        describe = getattr(source, "fingerprint_description", None)  # e.g. GrainDataSource's
        if describe is not None:
            desc["code"] = describe(split)
        else:
            desc["code"] = _code(fn) if fn is not None else repr(source)
    return desc


def source_digest(description: Mapping[str, Any]) -> str:
    return _digest(description)


def source_differences(
    recorded: Mapping[str, Any], current: Mapping[str, Any], compare_content: bool = True
) -> list[str]:
    """One line per source file that differs between two `source_description`s: added,
    removed, or changed in size (or, with `compare_content`, in SHA-256)."""
    out = [
        f"source {k} was {recorded.get(k)!r}, is {current.get(k)!r}"
        for k in ("type", "split")
        if recorded.get(k) != current.get(k)
    ]
    if "files" not in recorded or "files" not in current:
        if recorded.get("code") != current.get("code") or (recorded.get("shards") != current.get("shards")):
            out.append("source code or shards changed (not a file source)")
        return out
    key = lambda f: (f["pattern"], f["name"])
    old = {key(f): f for f in recorded["files"]}
    new = {key(f): f for f in current["files"]}
    for k in sorted(old.keys() | new.keys()):
        label = f"source file {k[1]!r} (pattern {k[0]})"
        if k not in new:
            out.append(f"{label} was cached but is gone (removed or renamed)")
        elif k not in old:
            out.append(f"{label} is new (added or renamed): not in the cache")
        elif old[k]["size"] != new[k]["size"]:
            out.append(
                f"{label} has {new[k]['size']} bytes, the cache recorded "
                f"{old[k]['size']}: it changed since it was cached"
            )
        elif old[k].get("window") != new[k].get("window"):
            out.append(f"{label} was cached with the example window {old[k].get('window')}, is {new[k].get('window')}")
        elif compare_content and old[k].get("sha256") != new[k].get("sha256"):
            out.append(
                f"{label} content changed since it was cached (sha256 "
                f"{str(old[k].get('sha256'))[:12]} -> {str(new[k].get('sha256'))[:12]})"
            )
    if not out and [key(f) for f in recorded["files"]] != [key(f) for f in current["files"]]:
        out.append("source files are listed in another order than when cached")
    return out


def task_fingerprint(
    task: Any, split: str, with_source: bool = True, source: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """`{part: sha256}` for the parts in `PARTS`, plus `total` over all of them.

    `with_source=False` leaves out `source` and `total` (no file is read); `source`, a
    `source_description` computed already, is hashed instead of reading the files again.
    """
    feats = {
        k: {"add_eos": f.add_eos, "required": f.required, "dtype": f.dtype, "rank": f.rank}
        # `token_ids` joins only when set, so the fingerprints of existing caches stay valid.
        | ({"token_ids": True} if getattr(f, "token_ids", False) else {})
        for k, f in sorted(task.output_features.items())
    }
    vocabs = {k: vocabulary_fingerprint(f.vocabulary) for k, f in sorted(task.output_features.items())}
    parts = {
        "preprocessors": _digest([preprocessor_description(p) for p in task.cacheable_preprocessors]),
        "features": _digest(feats),
        "vocabulary": _digest(vocabs),
    }
    if not with_source:
        return parts
    parts["source"] = source_digest(source if source is not None else source_description(task, split))
    parts["total"] = _digest([parts[p] for p in PARTS])
    return parts


def mismatched_parts(cached: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    return [p for p in PARTS if cached.get(p) != current.get(p)]
