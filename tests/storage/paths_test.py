"""cairn.storage.paths: URLs are never mangled, local paths behave as pathlib did."""

import os

import pytest

from cairn import storage


def test_urls_keep_their_double_slash():
    p = storage.path("gs://bucket/runs/x")
    assert os.fspath(p) == "gs://bucket/runs/x"
    assert os.fspath(p / "checkpoints" / "10") == "gs://bucket/runs/x/checkpoints/10"
    assert os.fspath(p.parent) == "gs://bucket/runs"
    assert p.name == "x"


@pytest.mark.parametrize(
    "url,scheme", [("gs://b/x", "gs"), ("s3://b/x", "s3"), ("/tmp/x", None), ("rel/x", None), ("GS://b", "gs")]
)
def test_scheme_and_is_url(url, scheme):
    assert storage.scheme(url) == scheme
    assert storage.is_url(url) == (scheme is not None)


def test_join():
    assert storage.join("gs://b/x/", "y", "z.json") == "gs://b/x/y/z.json"
    assert storage.join("/tmp/x", "y") == "/tmp/x/y"


def test_absolute_leaves_urls_alone(tmp_path):
    assert storage.absolute("gs://b/x") == "gs://b/x"
    assert storage.absolute("x", cwd=str(tmp_path)) == str(tmp_path / "x")


def test_local_paths_behave_like_pathlib(tmp_path):
    p = storage.path(tmp_path) / "a" / "b.txt"
    p.parent.mkdir(parents=True)
    p.write_text("hi")
    assert p.read_text() == "hi" and p.exists()
    assert sorted(x.name for x in storage.path(tmp_path / "a").iterdir()) == ["b.txt"]
    assert storage.sizes(tmp_path / "a") == {"b.txt": 2}
    assert storage.sizes(tmp_path / "missing") == {}


def test_importing_points_epath_away_from_tensorflow():
    assert os.environ.get("EPATH_USE_TF") == "false"


def test_emulator_variable_reaches_every_client():
    env = {"STORAGE_EMULATOR_HOST": "127.0.0.1:4443"}
    done = storage.configure_environment(env)
    assert env["TENSORSTORE_GCS_HTTP_URL"] == "http://127.0.0.1:4443"
    assert env["CLOUD_STORAGE_EMULATOR_ENDPOINT"] == "http://127.0.0.1:4443"
    assert env["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] == "false"
    assert "TENSORSTORE_GCS_HTTP_URL" in done
    assert storage.gcsfs_options(env)["token"] == "anon"
    # A user's own setting wins.
    env2 = {"STORAGE_EMULATOR_HOST": "http://h:1", "TENSORSTORE_GCS_HTTP_URL": "http://other:2"}
    storage.configure_environment(env2)
    assert env2["TENSORSTORE_GCS_HTTP_URL"] == "http://other:2"
    assert "token" not in storage.gcsfs_options({})
