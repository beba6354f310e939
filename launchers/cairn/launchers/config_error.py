"""`ConfigError`: a config value that cannot work, naming its key (the entry points print it
and exit with status 2)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config value that cannot work: `key` is the dotted config key."""

    def __init__(self, key: str, message: str):
        super().__init__(f"config key {key!r}: {message}")
        self.key = key
