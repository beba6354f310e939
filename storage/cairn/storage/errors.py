"""Errors of the storage layer."""

from __future__ import annotations


class StorageError(OSError):
    """A path cannot be used: a missing bucket, an unreachable endpoint, missing credentials,
    no permission to write. The message names the URL and what failed."""
