"""Atomic writes, create-if-absent and staged directories, on local disk and on gs:// (emulator).

A writer killed mid-write leaves the previous whole file or the new whole file, never a torn
one; create-if-absent lets exactly one of several racing processes win."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from cairn import storage
from cairn.storage.testing import GcsEmulator

WHERE = ["local", "gs"]


@pytest.fixture(params=WHERE)
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path)
    return request.getfixturevalue("bucket") + "/dir"


def test_write_and_read_back(root):
    p = storage.join(root, "sub", "a.json")
    storage.write_json(p, {"b": 1, "a": [1, 2]})
    assert storage.read_json(p) == {"a": [1, 2], "b": 1}
    assert storage.read_text(p) == '{"a": [1, 2], "b": 1}'
    storage.write_text(p, "replaced")
    assert storage.read_text(p) == "replaced"
    assert storage.path(p).exists()
    assert storage.sizes(storage.join(root, "sub")) == {"a.json": 8}


def test_read_ranges_one_request_per_range(root):
    a, b = storage.join(root, "a.bin"), storage.join(root, "b.bin")
    storage.write_bytes(a, bytes(range(256)) * 4)
    storage.write_bytes(b, b"0123456789")
    got = storage.read_ranges([(a, 0, 3), (b, 2, 5), (a, 1020, 1024), (a, 256, 258), (b, 0, 10)])
    assert got == [b"\x00\x01\x02", b"234", b"\xfc\xfd\xfe\xff", b"\x00\x01", b"0123456789"]
    assert storage.read_ranges([]) == []
    with pytest.raises(storage.StorageError, match=r"b.bin: bytes \[8, 12\) asked, 2 read"):
        storage.read_ranges([(b, 8, 12)])
    with pytest.raises(storage.StorageError, match=r"a.bin: bad byte range \[5, 5\)"):
        storage.read_ranges([(a, 5, 5)])


def test_read_ranges_gs_one_get_each_and_gcsfs_for_the_rest(bucket, monkeypatch):
    """On gs:// a range is one GET on gcsfs's session; an answer other than 206 (a missing
    object, a range past the end) goes through gcsfs's own `_cat_file`, whose error is raised
    as a StorageError naming the object."""
    import gcsfs

    a = storage.join(bucket, "a.bin")
    storage.write_bytes(a, bytes(range(256)) * 4)
    fallbacks = []
    original = gcsfs.GCSFileSystem._cat_file

    async def counted(self, path, start=None, end=None, **kwargs):
        fallbacks.append((path, start, end))
        return await original(self, path, start=start, end=end, **kwargs)

    monkeypatch.setattr(gcsfs.GCSFileSystem, "_cat_file", counted)
    ranges = [(a, 0, 3), (a, 1020, 1024), (a, 256, 258)] * 3
    assert storage.read_ranges(ranges) == [b"\x00\x01\x02", b"\xfc\xfd\xfe\xff", b"\x00\x01"] * 3
    assert fallbacks == []
    with pytest.raises(storage.StorageError, match=r"missing.bin: reading bytes \[0, 4\) failed: FileNotFoundError"):
        storage.read_ranges([(a, 0, 1), (storage.join(bucket, "missing.bin"), 0, 4)])
    assert [f[1:] for f in fallbacks] == [(0, 4)]
    with pytest.raises(storage.StorageError, match=r"a.bin: "):
        storage.read_ranges([(a, 2000, 2004)])
    assert [f[1:] for f in fallbacks] == [(0, 4), (2000, 2004)]


def test_read_ranges_follow_the_emulator_endpoint(bucket, tmp_path):
    """The object URLs read_ranges keeps are per endpoint: the same name on another emulator
    (here one on disk, `GcsEmulator(root=...)`) reads that emulator's bytes."""
    name = bucket.removeprefix("gs://")
    p = storage.join(bucket, "x.bin")
    storage.write_bytes(p, b"first emulator")
    assert storage.read_ranges([(p, 0, 5)]) == [b"first"]
    with GcsEmulator(root=tmp_path / "emu") as other:
        other.activate()
        assert other.create_bucket(name) == bucket
        storage.write_bytes(p, b"other emulator")
        assert storage.read_ranges([(p, 0, 5)]) == [b"other"]
    assert storage.read_ranges([(p, 0, 5)]) == [b"first"]  # stop() restored this process's endpoint


def test_emulator_on_disk_keeps_objects_across_restarts(tmp_path):
    """`GcsEmulator(root=DIR)`: objects stored on disk, there again after a restart on DIR;
    creating an existing bucket keeps it; `pid` is the server's process while it runs."""
    with GcsEmulator(root=tmp_path) as emu:
        assert emu.pid and os.path.exists(f"/proc/{emu.pid}")
        emu.activate()
        bucket = emu.create_bucket("kept")
        storage.write_bytes(storage.join(bucket, "d", "x.bin"), b"0123456789")
    assert emu.pid is None
    with GcsEmulator(root=tmp_path) as emu:
        emu.activate()
        assert emu.create_bucket("kept") == bucket
        assert storage.file_sizes(bucket) == {"d/x.bin": 10}
        assert storage.read_ranges([(storage.join(bucket, "d", "x.bin"), 3, 7)]) == [b"3456"]


def test_local_write_leaves_no_temporary(tmp_path):
    storage.write_bytes(tmp_path / "x.bin", b"123")
    assert sorted(os.listdir(tmp_path)) == ["x.bin"]


def test_create_exclusive_only_once(root):
    p = storage.join(root, "lock")
    assert storage.create_exclusive(p, b"first") is True
    assert storage.create_exclusive(p, b"second") is False
    assert storage.read_bytes(p) == b"first"
    storage.remove(p)
    assert storage.create_exclusive(p, b"third") is True
    assert storage.read_bytes(p) == b"third"


_RACER = textwrap.dedent("""
    import sys
    from cairn import storage
    won = storage.create_exclusive(sys.argv[1], sys.argv[2].encode())
    print("won" if won else "lost", flush=True)
""")

_WRITER = textwrap.dedent("""
    import sys
    from cairn import storage
    size = int(sys.argv[2])
    i = 0
    while True:
        storage.write_bytes(sys.argv[1], bytes([65 + i % 2]) * size)
        print("wrote", i, flush=True)
        i += 1
""")


def _child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def test_racing_processes_one_winner(root):
    p = storage.join(root, "race.lock")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, p, f"proc{i}"],
            stdout=subprocess.PIPE,
            text=True,
            env=_child_env(),
            start_new_session=True,
        )
        for i in range(4)
    ]
    try:
        outs = [q.communicate(timeout=240)[0].strip() for q in procs]
    finally:
        for q in procs:
            if q.poll() is None:
                os.killpg(q.pid, signal.SIGKILL)
                q.wait()
    assert sorted(outs) == ["lost", "lost", "lost", "won"]
    winner = outs.index("won")
    assert storage.read_bytes(p) == f"proc{winner}".encode()


@pytest.mark.parametrize("delay", [0.3, 1.1])
def test_a_killed_writer_leaves_no_torn_file(root, delay):
    """SIGKILL while a 4 MB file is rewritten again and again: what is there is whole."""
    size = 4 << 20
    p = storage.join(root, f"big-{delay}.bin")
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, p, str(size)],
        stdout=subprocess.PIPE,
        text=True,
        env=_child_env(),
        start_new_session=True,
    )
    try:
        assert proc.stdout.readline().startswith("wrote 0")
        time.sleep(delay)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    data = storage.read_bytes(p)
    assert len(data) == size
    assert data in (b"A" * size, b"B" * size)
    if not storage.is_url(p):
        # What a kill may leave besides the file is a hidden temporary, never the file's own name.
        others = set(os.listdir(os.path.dirname(p))) - {os.path.basename(p)}
        assert all(n.startswith(f".{os.path.basename(p)}.") and n.endswith(".tmp") for n in others)


def test_staged_directory_uploads_changed_files_whole(bucket, tmp_path):
    target = bucket + "/tb"
    staged = storage.StagedDirectory(target)
    assert os.path.isdir(staged.local_dir)
    os.makedirs(os.path.join(staged.local_dir, "train"))
    with open(os.path.join(staged.local_dir, "train", "events.1"), "wb") as f:
        f.write(b"one")
    assert staged.sync() == 1
    assert staged.sync() == 0  # nothing changed
    with open(os.path.join(staged.local_dir, "train", "events.1"), "ab") as f:
        f.write(b"two")
    staged.close()
    assert storage.read_bytes(target + "/train/events.1") == b"onetwo"
    assert not os.path.exists(staged.local_dir)
    local = storage.StagedDirectory(tmp_path / "tb")
    assert local.local_dir == str(tmp_path / "tb") and local.sync() == 0


def test_emulator_stops_without_a_leaked_process():
    emu = GcsEmulator().start()
    pid = emu._process.pid
    emu.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_trees(root):
    src = storage.join(root, "tree")
    storage.write_bytes(storage.join(src, "a.bin"), b"12")
    storage.write_bytes(storage.join(src, "sub", "b.bin"), b"345")
    assert storage.file_sizes(src) == {"a.bin": 2, "sub/b.bin": 3}
    dst = storage.join(root, "moved", "tree")
    storage.move_tree(src, dst)
    assert storage.file_sizes(src) == {}
    assert storage.file_sizes(dst) == {"a.bin": 2, "sub/b.bin": 3}
    storage.remove_tree(dst)
    assert storage.file_sizes(dst) == {}
    storage.remove_tree(dst)  # absent: nothing


def test_json_lines_append_and_read_in_order(root):
    p = storage.join(root, "s", "metrics.jsonl")
    w = storage.JsonLinesWriter(p)
    w.append([{"step": 1}, {"step": 2}])
    w.append([{"step": 3}], flush=True)
    w.close()
    w2 = storage.JsonLinesWriter(p)  # a resumed writer continues after what is there
    w2.append([{"step": 4}])
    w2.close()
    rows, bad = storage.read_json_lines(p)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and bad == 0
    if storage.is_url(p):
        assert sorted(storage.sizes(p + ".parts")) == ["00000000.jsonl", "00000001.jsonl"]


def test_json_lines_local_truncated_last_line(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1}\nnot json\n{"step": 2}\n{"ste')
    rows, bad = storage.read_json_lines(p)
    assert [r["step"] for r in rows] == [1, 2] and bad == 1
    storage.JsonLinesWriter(p).append([{"step": 3}])
    assert [r["step"] for r in storage.read_json_lines(p)[0]] == [1, 2, 3]


def test_json_lines_superseded_rows_move_aside_part_by_part(root):
    """A resume at step 3: the rows after it (a discarded timeline's) move to the aside file,
    marked; at a URL a part keeping rows is rewritten whole and a part left empty removed. A
    second call (nothing after 3) reads the tail only and moves nothing."""
    p, aside = storage.join(root, "s", "metrics.jsonl"), storage.join(root, "old", "metrics.jsonl")
    w = storage.JsonLinesWriter(p)
    w.append([{"step": 1}, {"step": 2}, {"step": 3}, {"step": 4}], flush=True)
    w.append([{"step": 5}, {"step": 6}], flush=True)
    w.close()
    assert storage.supersede_after(p, 3, aside) == 3
    assert [r["step"] for r in storage.read_json_lines(p)[0]] == [1, 2, 3]
    moved = storage.read_json_lines(aside)[0]
    assert [(r["step"], r["superseded_after_step"]) for r in moved] == [(4, 3), (5, 3), (6, 3)]
    if storage.is_url(p):
        assert sorted(storage.sizes(p + ".parts")) == ["00000000.jsonl"]
    resumed = storage.JsonLinesWriter(p)
    resumed.append([{"step": 4}], flush=True)
    resumed.close()
    assert [r["step"] for r in storage.read_json_lines(p)[0]] == [1, 2, 3, 4]
    assert storage.supersede_after(p, 4, aside) == 0 and len(storage.read_json_lines(aside)[0]) == 3
