"""The fingerprint of a task definition: what a cache was built from.

Parts (each a SHA-256 hex digest), so a mismatch can say what changed:
  * `preprocessors`: name, source code (or bytecode when the source is unavailable) and
    bound arguments of each *cacheable* preprocessor (those the cache runs);
  * `features`: the output features (name, add_eos, required, dtype, rank);
  * `vocabulary`: each output feature's vocabulary (type and content);
  * `source`: the source's type, split and, for file sources, every file's name, size and
    SHA-256 of its bytes (for other sources, the code of the function behind it).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf

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
    while isinstance(fn, functools.partial):
        args = list(fn.args) + args
        kwargs = {**fn.keywords, **kwargs}
        fn = fn.func
    wrapped = getattr(fn, "__wrapped__", None)
    return {"name": f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}",
            "code": _code(fn), "wrapped_code": _code(wrapped) if wrapped else None,
            "args": _value(args), "kwargs": _value(kwargs)}


def vocabulary_fingerprint(vocab: Any) -> str:
    fp = getattr(vocab, "fingerprint", None)
    content = vocab._content_key() if hasattr(vocab, "_content_key") else repr(vocab)
    return _digest([type(vocab).__name__, fp if isinstance(fp, str) else None, repr(content),
                    getattr(vocab, "extra_ids", None)])


def file_fingerprint(path: str, chunk: int = 1 << 20) -> dict:
    """Name, size and SHA-256 of one file (read through tf.io.gfile)."""
    h = hashlib.sha256()
    size = 0
    with tf.io.gfile.GFile(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
            size += len(block)
    return {"name": path, "size": size, "sha256": h.hexdigest()}


def source_description(task: Any, split: str) -> dict:
    source = task.source
    files = source.list_shards(split)
    desc: dict = {"type": type(source).__name__, "split": split}
    if getattr(source, "_patterns", None) is not None:
        desc["files"] = [file_fingerprint(p) for p in files]
    else:
        desc["shards"] = files
        fn = getattr(source, "_fn", None)
        desc["code"] = _code(fn) if fn is not None else repr(source)
    return desc


def task_fingerprint(task: Any, split: str, with_source: bool = True) -> dict[str, str]:
    """`{part: sha256}` for the parts in `PARTS`, plus `total` over all of them.

    `with_source=False` leaves out `source` and `total` (no file is read).
    """
    feats = {k: {"add_eos": f.add_eos, "required": f.required, "dtype": f.dtype.name,
                 "rank": f.rank} for k, f in sorted(task.output_features.items())}
    vocabs = {k: vocabulary_fingerprint(f.vocabulary)
              for k, f in sorted(task.output_features.items())}
    parts = {
        "preprocessors": _digest([preprocessor_description(p)
                                  for p in task.cacheable_preprocessors]),
        "features": _digest(feats),
        "vocabulary": _digest(vocabs),
    }
    if not with_source:
        return parts
    parts["source"] = _digest(source_description(task, split))
    parts["total"] = _digest([parts[p] for p in PARTS])
    return parts


def mismatched_parts(cached: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    return [p for p in PARTS if cached.get(p) != current.get(p)]
