"""A local working copy of a directory that lives at a URL, for writers that only write local
files (TensorFlow's event-file writer: its own GCS client cannot be pointed at an emulator and
is not the path layer Cairn uses).

The writer writes under `local_dir`; `sync()` uploads each file that changed since the last
sync as one whole object (never torn: an object store shows an upload only once it is
complete). For a local target, `local_dir` is the target itself and `sync()` does nothing.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from cairn.storage.atomic import write_bytes
from cairn.storage.paths import PathLike, is_url, join


class StagedDirectory:
    """`local_dir` to write in; `sync()` mirrors changed files to `target`; `close()` syncs and
    removes the local copy."""

    def __init__(self, target: PathLike):
        self.target = os.fspath(target)
        self.remote = is_url(self.target)
        if self.remote:
            self.local_dir = tempfile.mkdtemp(prefix="cairn-staged-")
        else:
            self.local_dir = self.target
            os.makedirs(self.local_dir, exist_ok=True)
        self._seen: dict[str, tuple[int, int]] = {}

    def sync(self) -> int:
        """Uploads the files changed since the last sync; returns how many."""
        if not self.remote:
            return 0
        count = 0
        for root, _, files in os.walk(self.local_dir):
            for name in sorted(files):
                local = os.path.join(root, name)
                st = os.stat(local)
                key = (st.st_size, st.st_mtime_ns)
                rel = os.path.relpath(local, self.local_dir)
                if self._seen.get(rel) == key:
                    continue
                with open(local, "rb") as f:
                    write_bytes(join(self.target, *rel.split(os.sep)), f.read())
                self._seen[rel] = key
                count += 1
        return count

    def close(self) -> None:
        if self.remote:
            self.sync()
            shutil.rmtree(self.local_dir, ignore_errors=True)
