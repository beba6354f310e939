"""Whole directories (trees): sizes of every file, move, delete — one listing on a bucket."""

from __future__ import annotations

import os
import shutil

from cairn.storage.paths import PathLike, filesystem, is_url


def file_sizes(root: PathLike) -> dict[str, int]:
    """`{relative path: bytes}` of every file under `root` ('/'-separated; {} when absent)."""
    s = os.fspath(root)
    if not is_url(s):
        out = {}
        for base, _, files in os.walk(s):
            for name in files:
                full = os.path.join(base, name)
                out[os.path.relpath(full, s).replace(os.sep, "/")] = os.path.getsize(full)
        return dict(sorted(out.items()))
    fs, inner = filesystem(s)
    inner = inner.rstrip("/")
    try:
        found = fs.find(inner, detail=True)
    except FileNotFoundError:
        return {}
    out = {}
    for name, info in found.items():
        if info.get("type") == "file" and name.startswith(inner + "/"):
            out[name[len(inner) + 1 :]] = int(info.get("size") or 0)
    return dict(sorted(out.items()))


def move_tree(src: PathLike, dst: PathLike) -> None:
    """Moves the directory `src` to `dst` (on a bucket: copy, then delete, object by object)."""
    s, d = os.fspath(src), os.fspath(dst)
    if not is_url(s):
        os.makedirs(os.path.dirname(os.path.abspath(d)), exist_ok=True)
        shutil.move(s, d)
        return
    fs, inner = filesystem(s)
    _, inner_dst = filesystem(d)
    fs.mv(inner.rstrip("/"), inner_dst.rstrip("/"), recursive=True)


def remove_tree(p: PathLike) -> None:
    """Deletes the directory `p` and everything under it (nothing when absent)."""
    s = os.fspath(p)
    if not is_url(s):
        shutil.rmtree(s, ignore_errors=True)
        return
    fs, inner = filesystem(s)
    try:
        fs.rm(inner.rstrip("/"), recursive=True)
    except FileNotFoundError:
        pass
