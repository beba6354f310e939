"""hf_files.read_header: tensor names and single tensors' bytes without loading the file."""

import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

from cairn.models.hf_files import read_header


def test_header_and_raw_bytes(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensors = {"a": a, "same": a.copy(), "other": a + 1, "as_int": a.view(np.int32), "flat": a.reshape(12)}
    path = str(tmp_path / "m.safetensors")
    save_file(tensors, path, metadata={"format": "pt"})
    header = read_header(path)
    assert sorted(header.entries) == sorted(tensors)  # __metadata__ dropped
    assert header.entries["a"]["dtype"] == "F32" and header.entries["a"]["shape"] == [3, 4]
    for name, value in tensors.items():
        assert header.raw(name) == value.tobytes(), name
    assert header.same_tensor("a", "same")
    assert not header.same_tensor("a", "other")
    assert not header.same_tensor("a", "as_int")  # same bytes count, other dtype
    assert not header.same_tensor("a", "flat")  # same bytes, other shape


def test_not_a_safetensors_file(tmp_path):
    short = tmp_path / "short"
    short.write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match="short is not a safetensors file"):
        read_header(str(short))
    huge = tmp_path / "huge"
    huge.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ValueError, match="header length"):
        read_header(str(huge))
    garbage = tmp_path / "garbage"
    garbage.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{]")
    with pytest.raises(ValueError, match="header"):
        read_header(str(garbage))
