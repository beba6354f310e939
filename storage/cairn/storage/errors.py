"""Errors of the storage layer."""

from __future__ import annotations


class StorageError(OSError):
    """A path cannot be used: a missing bucket, an unreachable endpoint, missing credentials,
    no permission to write. The message names the URL and what failed."""


class StorageUnavailableError(StorageError):
    """A bucket kept failing (429, 5xx, dropped connections) for longer than the retry budget
    (`cairn.storage.retries`): `bucket` and `operation` name what failed, `seconds` how long it
    was retried."""

    def __init__(self, bucket: str, operation: str, seconds: float, budget: float, cause: str):
        self.bucket, self.operation, self.seconds, self.budget = bucket, operation, seconds, budget
        super().__init__(
            f"bucket '{bucket}' unavailable: {operation} still failing after {seconds:.0f} s of retries "
            f"(the retry budget is {budget:g} s, CAIRN_STORAGE_RETRY_S): {cause}"
        )

    def __str__(self) -> str:
        return str(self.args[0])
