"""cairn.storage: one path layer for local files and buckets (`gs://`, `s3://`).

Importing it sets up the storage clients' environment (`configure_environment`): URLs go
through fsspec (gcsfs), never TensorFlow's file system, and `STORAGE_EMULATOR_HOST` reaches
every client (orbax's tensorstore and array-record included).
"""

from cairn.storage.environment import configure_environment, emulator_endpoint, gcsfs_options
from cairn.storage.errors import StorageError
from cairn.storage.exclusive import create_exclusive, remove
from cairn.storage.paths import Path, PathLike, absolute, filesystem, is_url, join, path, scheme, sizes
from cairn.storage.atomic import read_bytes, read_json, read_text, write_bytes, write_json, write_text
from cairn.storage.probe import check_writable
from cairn.storage.staging import StagedDirectory

__version__ = "0.1.0"

configure_environment()

__all__ = [
    "Path", "PathLike", "StagedDirectory", "StorageError", "absolute", "check_writable",
    "configure_environment", "create_exclusive", "emulator_endpoint", "filesystem", "gcsfs_options",
    "is_url", "join", "path", "read_bytes", "read_json", "read_text", "remove", "scheme", "sizes",
    "write_bytes", "write_json", "write_text",
]
