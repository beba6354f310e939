"""A task's raw source that is missing or empty, as a data error (one line, exit status 2)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from cairn.datatasks import DataTasksError


class SourceError(DataTasksError):
    """A task's raw source files are missing or empty (nothing to cache)."""


@contextlib.contextmanager
def source_errors_as_data_errors(task: str | None = None, split: str | None = None) -> Iterator[None]:
    """Re-raises a missing file or directory met while reading a task's source (a source function
    raising `FileNotFoundError`, a path under a file) as `SourceError`, naming the task."""
    try:
        yield
    except (FileNotFoundError, NotADirectoryError) as e:
        what = f"task {task!r}" + (f" (split {split!r})" if split else "") if task else "a task"
        raise SourceError(f"{what}: its source cannot be read: {e}") from e
