"""check_writable: a missing bucket, an unreachable endpoint, an unwritable local path: one
`StorageError` naming the URL and what failed, and nothing left behind."""

import os
import socket

import pytest

from cairn import storage


def test_writable_bucket_passes_and_leaves_nothing(bucket):
    storage.check_writable(bucket + "/runs/x", what="model_dir")
    assert storage.sizes(bucket + "/runs/x") == {}


def test_missing_bucket(emulator):
    with pytest.raises(storage.StorageError) as e:
        storage.check_writable("gs://no-such-bucket/runs/x", what="model_dir")
    msg = str(e.value)
    assert "model_dir gs://no-such-bucket/runs/x" in msg and "bucket 'no-such-bucket' does not exist" in msg
    assert "\n" not in msg


def test_unreachable_endpoint(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    with pytest.raises(storage.StorageError) as e:
        storage.check_writable("gs://bucket/runs/x", what="model_dir", timeout=5)
    assert f"cannot reach the storage endpoint http://127.0.0.1:{port}" in str(e.value)
    assert "gs://bucket/runs/x" in str(e.value)


def test_local_path_under_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(storage.StorageError) as e:
        storage.check_writable(tmp_path / "file" / "run", what="model_dir")
    assert f"model_dir {tmp_path / 'file' / 'run'}: cannot write" in str(e.value)


def test_local_directory_is_not_created_and_an_existing_one_left_as_it_was(tmp_path):
    storage.check_writable(tmp_path / "new" / "run")
    assert not (tmp_path / "new").exists()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("x")
    storage.check_writable(tmp_path / "run")
    assert os.listdir(tmp_path / "run") == ["keep.txt"]


class _Refusing:
    """An fsspec-like filesystem whose uploads fail as a real bucket's would."""

    def __init__(self, error):
        self.error = error

    def pipe_file(self, path, data, **kwargs):
        raise self.error


class DefaultCredentialsError(Exception):
    """Named as google-auth's, which gcsfs raises when no credentials are found."""


@pytest.mark.parametrize(
    "error,expected",
    [
        (
            PermissionError("403 Forbidden: caller does not have storage.objects.create access"),
            "no permission to write (at https://storage.googleapis.com); check the credentials",
        ),
        (OSError("401 Unauthorized"), "no permission to write"),
        (
            DefaultCredentialsError("Your default credentials were not found"),
            "no credentials for https://storage.googleapis.com: set GOOGLE_APPLICATION_CREDENTIALS",
        ),
    ],
)
def test_permission_and_credential_errors_are_named(monkeypatch, error, expected):
    """A real bucket's refusals (the emulator has no IAM), mapped to one line each."""
    from cairn.storage import probe

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setattr(probe, "_reachable", lambda url, timeout: None)
    monkeypatch.setattr(probe, "filesystem", lambda p: (_Refusing(error), p))
    with pytest.raises(storage.StorageError) as e:
        storage.check_writable("gs://real-bucket/runs/x", what="model_dir")
    msg = str(e.value)
    assert msg.startswith("model_dir gs://real-bucket/runs/x: ") and expected in msg
    assert "\n" not in msg
