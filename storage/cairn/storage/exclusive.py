"""Create-if-absent: the primitive behind a lock that works on a bucket too.

Local: the content is written to a temporary file, then hard-linked to the target name; the
link fails if the name exists, so the file appears complete or not at all. `gs://`: one upload
with the precondition `ifGenerationMatch=0` (the store refuses it when any generation of the
object exists), atomic on the server.
"""

from __future__ import annotations

import os

from cairn.storage.atomic import local_temporary
from cairn.storage.paths import PathLike, filesystem, is_url


def create_exclusive(p: PathLike, data: bytes) -> bool:
    """Creates `p` holding `data` unless it exists; True when this call created it."""
    s = os.fspath(p)
    if is_url(s):
        fs, inner = filesystem(s)
        try:
            fs.pipe_file(inner, bytes(data), mode="create")
        except FileExistsError:
            return False
        return True
    tmp = local_temporary(s, data)
    try:
        try:
            os.link(tmp, s)
        except FileExistsError:
            return False
        return True
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def remove(p: PathLike, missing_ok: bool = True) -> None:
    """Deletes the file or object `p`."""
    s = os.fspath(p)
    if is_url(s):
        fs, inner = filesystem(s)
        try:
            fs.rm_file(inner)
        except FileNotFoundError:
            if not missing_ok:
                raise
        return
    try:
        os.unlink(s)
    except FileNotFoundError:
        if not missing_ok:
            raise
