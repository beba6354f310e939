"""cairn.storage: one path layer for local files and buckets (`gs://`, `s3://`).

Importing it sets up the storage clients' environment (`configure_environment`): URLs go
through fsspec (gcsfs), never TensorFlow's file system, and `STORAGE_EMULATOR_HOST` reaches
every client (orbax's tensorstore and array-record included).
"""

from cairn.storage.atomic import copy_file, read_bytes, read_json, read_text, write_bytes, write_json, write_text
from cairn.storage.environment import configure_environment, emulator_endpoint, gcsfs_options
from cairn.storage.errors import StorageError, StorageUnavailableError
from cairn.storage.exclusive import create_exclusive, remove
from cairn.storage.json_lines import JsonLinesWriter, read_json_lines, supersede_after
from cairn.storage.paths import Path, PathLike, absolute, filesystem, is_url, join, path, scheme, sizes
from cairn.storage.probe import check_writable
from cairn.storage.ranges import read_ranges
from cairn.storage.retries import DEFAULT_RETRY_S, RETRY_VARIABLE, retry_budget, set_retry_budget
from cairn.storage.staging import StagedDirectory
from cairn.storage.trees import file_sizes, move_tree, remove_tree

__version__ = "0.1.0"

configure_environment()

__all__ = [
    "DEFAULT_RETRY_S",
    "RETRY_VARIABLE",
    "StorageUnavailableError",
    "retry_budget",
    "set_retry_budget",
    "JsonLinesWriter",
    "Path",
    "PathLike",
    "StagedDirectory",
    "StorageError",
    "absolute",
    "check_writable",
    "configure_environment",
    "copy_file",
    "create_exclusive",
    "emulator_endpoint",
    "file_sizes",
    "filesystem",
    "gcsfs_options",
    "move_tree",
    "remove_tree",
    "is_url",
    "join",
    "path",
    "read_bytes",
    "read_json",
    "read_json_lines",
    "read_ranges",
    "read_text",
    "remove",
    "scheme",
    "sizes",
    "supersede_after",
    "write_bytes",
    "write_json",
    "write_text",
]
