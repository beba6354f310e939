"""What every family's Hugging Face interchange shares: a transformers checkpoint directory's
file names, `HFInterchangeError`, and a safetensors file's header and single tensors' bytes, read
without loading the whole file.

The format: 8 bytes (little-endian u64) giving the header's length, the header (JSON:
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`), then the
data, offsets counted from its start. Reads go through `cairn.storage` (local or a URL), by
byte range, so learning a checkpoint's layout costs a few kilobytes.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any

from cairn import storage

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit


class HFInterchangeError(ValueError):
    """A checkpoint or config that cannot be mapped between the two layouts."""


@dataclasses.dataclass(frozen=True)
class SafetensorsHeader:
    """The tensors of one safetensors file: `entries[name]` is `{"dtype", "shape", "data_offsets"}`."""

    path: str
    entries: dict[str, dict[str, Any]]
    data_start: int

    def raw(self, name: str) -> bytes:
        """The stored bytes of tensor `name` (KeyError when absent)."""
        begin, end = self.entries[name]["data_offsets"]
        fs, inner = storage.filesystem(self.path)
        return fs.cat_file(inner, self.data_start + begin, self.data_start + end)

    def same_tensor(self, a: str, b: str) -> bool:
        """Whether tensors `a` and `b` hold the same dtype, shape and bytes."""
        ea, eb = self.entries[a], self.entries[b]
        if (ea["dtype"], list(ea["shape"])) != (eb["dtype"], list(eb["shape"])):
            return False
        return self.raw(a) == self.raw(b)


def read_header(path: str) -> SafetensorsHeader:
    """The header of the safetensors file at `path` (ValueError naming it when it is not one)."""
    fs, inner = storage.filesystem(path)
    head = fs.cat_file(inner, 0, 8)
    if len(head) < 8:
        raise ValueError(f"{path} is not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", head)
    if n > _MAX_HEADER:
        raise ValueError(f"{path} is not a safetensors file (header length {n})")
    try:
        entries = json.loads(fs.cat_file(inner, 8, 8 + n))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a safetensors file (header: {e})") from None
    entries.pop("__metadata__", None)
    return SafetensorsHeader(str(path), entries, 8 + n)
