"""`TableDataSource`: Parquet, Arrow (a Hugging Face `datasets` folder, an IPC file), CSV and TSV
read alike, sliced, fingerprinted, at a gs:// URL (fake-gcs-server) and on Beam; every bad input
one line naming the file (and the row group or row), with no cache left half-written."""

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

import cairn.datatasks as dt
from cairn import storage
from cairn.datatasks import preprocessors as pp
from cairn.datatasks.deterministic import CachedTask, cache_task_in_process
from cairn.datatasks.deterministic.cache_job import cache_tasks, worker_error
from cairn.datatasks.deterministic.fingerprint import source_description, task_fingerprint
from cairn.datatasks.deterministic.store import CacheMismatchError, is_completed
from cairn.datatasks.url_sources import CorruptSourceError
from cairn.tokenizers import ByteVocabulary

QA = {"inputs": "question", "targets": "answer"}
SPLITS = {"train": "train[:90%]", "validation": "train[90%:]"}


def _table(lines, start, n):
    return pa.table(
        {
            "id": list(range(start, start + n)),
            "question": lines[start : start + n],
            "answer": lines[start + 1 : start + n + 1],
            "score": [i / 4 for i in range(start, start + n)],
        }
    )


def _write_hf_folder(folder, tables):
    """A `datasets` `save_to_disk` folder of one split, `train`: Arrow stream files and state.json."""
    (folder / "train").mkdir(parents=True)
    (folder / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    names = [f"data-{i:05d}-of-{len(tables):05d}.arrow" for i in range(len(tables))]
    for name, table in zip(names, tables):
        with pa.ipc.new_stream(str(folder / "train" / name), table.schema) as w:
            for batch in table.to_batches(max_chunksize=40):
                w.write_batch(batch)
    state = {"_data_files": [{"filename": n} for n in names], "_split": "train", "_fingerprint": "x"}
    (folder / "train" / "state.json").write_text(json.dumps(state))
    (folder / "train" / "dataset_info.json").write_text("{}")


@pytest.fixture(scope="module")
def tables(lines, tmp_path_factory):
    """`(folder, rows)`: the same 300 rows as two Parquet files (row groups of 64), a `datasets`
    folder, an Arrow IPC file, CSV and TSV; `rows` the expected (question, answer) pairs."""
    root = tmp_path_factory.mktemp("tables")
    parts = [_table(lines, 0, 200), _table(lines, 200, 100)]
    for i, t in enumerate(parts):
        pq.write_table(t, root / f"qa-{i}.parquet", row_group_size=64)
        pcsv.write_csv(t, root / f"qa-{i}.csv")
        pcsv.write_csv(t, root / f"qa-{i}.tsv", pcsv.WriteOptions(delimiter="\t", quoting_style="none"))
    _write_hf_folder(root / "hf", parts)
    with pa.ipc.new_file(str(root / "qa.arrow"), parts[0].schema) as w:
        for t in parts:
            w.write_table(t)
    rows = [(q.encode(), a.encode()) for t in parts for q, a in zip(t["question"].to_pylist(), t["answer"].to_pylist())]
    return root, rows


def _sources(root):
    return {
        "parquet": dt.TableDataSource({"train": str(root / "qa-*.parquet")}, "parquet", QA),
        "hf": dt.TableDataSource.from_hf_folder(str(root / "hf"), QA),
        "hf_dataset": dt.TableDataSource.from_hf_folder(str(root / "hf" / "train"), QA),  # one Dataset
        "arrow": dt.TableDataSource({"train": str(root / "qa.arrow")}, "arrow", QA),
        "csv": dt.TableDataSource({"train": str(root / "qa-*.csv")}, "csv", QA),
        "tsv": dt.TableDataSource({"train": str(root / "qa-*.tsv")}, "tsv", QA),
    }


def _pairs(ds):
    return [(x["inputs"], x["targets"]) for x in ds.as_numpy_iterator()]


def _task(name, source):
    feats = {"inputs": dt.Feature(ByteVocabulary()), "targets": dt.Feature(ByteVocabulary())}
    return dt.Task(name, source, feats, [pp.tokenize, pp.append_eos_after_trim])


def test_every_format_reads_the_same_rows_without_pyarrow_at_import(tables):
    root, rows = tables
    for fmt, src in _sources(root).items():
        assert _pairs(src.get_dataset("train", shuffle=False)) == rows, fmt
        if fmt != "arrow":  # two files: shard 1 of 2 is the second file
            assert _pairs(src.get_dataset("train", shuffle=False, shard_info=dt.ShardInfo(1, 2))) == rows[200:], fmt
        shuffled = _pairs(src.get_dataset("train", shuffle=True, seed=3))
        assert sorted(shuffled) == sorted(rows) and shuffled == _pairs(src.get_dataset("train", seed=3)), fmt
    numbers = dt.TableDataSource({"train": str(root / "qa-1.parquet")}, "parquet", ["id", "score"])
    first = next(numbers.get_dataset("train", shuffle=False).as_numpy_iterator())
    assert first["id"] == 200 and first["id"].dtype.name == "int64" and first["score"] == 50.0
    code = "import sys, cairn.datatasks; print('pyarrow' in sys.modules, 'tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_split_slicing_and_fingerprint(tables, tmp_path, monkeypatch):
    root, rows = tables
    src = dt.TableDataSource({"train": str(root / "qa-*.parquet")}, "parquet", QA, splits=SPLITS)
    assert src.splits == ("train", "validation")
    assert src.num_input_examples("train") == 270 and src.num_input_examples("validation") == 30
    [window] = src.source_files("validation")  # only the second file, its last 30 rows
    assert (window.name, window.skip, window.take) == ("qa-1.parquet", 70, 30)
    read_row_group, groups = pq.ParquetFile.read_row_group, []
    monkeypatch.setattr(
        pq.ParquetFile, "read_row_group", lambda f, g, **kw: groups.append(g) or read_row_group(f, g, **kw)
    )
    validation = _pairs(src.get_dataset("validation", shuffle=False))
    assert groups == [1]  # rows 64-99 of the file; its row group 0 (rows 0-63) is not read
    assert _pairs(src.get_dataset("train", shuffle=False)) + validation == rows
    hf = dt.TableDataSource.from_hf_folder(str(root / "hf"), QA, splits=SPLITS)
    assert _pairs(hf.get_dataset("validation", shuffle=False)) == rows[270:]
    # The fingerprint: each file's name, size and SHA-256, with the format and columns read.
    desc = source_description(_task("fp", src), "validation")
    assert [f["window"] for f in desc["files"]] == [[70, 30]] and desc["read"]["columns"] == QA
    other = dt.TableDataSource(
        {"train": str(root / "qa-*.parquet")}, "parquet", {"inputs": "answer", "targets": "question"}
    )
    digest = lambda s: task_fingerprint(_task("fp", s), "train")["source"]
    assert digest(other) != digest(dt.TableDataSource({"train": str(root / "qa-*.parquet")}, "parquet", QA))


def _broken(tmp_path, lines):
    """`{case: (source, expected message)}`: each bad input of issue 55's item 4."""
    t = _table(lines, 0, 10)
    good = tmp_path / "good.parquet"
    pq.write_table(t, good, row_group_size=4)
    (tmp_path / "truncated.parquet").write_bytes(good.read_bytes()[:-9])
    (tmp_path / "empty.parquet").write_bytes(b"")
    other = t.set_column(2, "answer", pa.array(range(10), pa.int64()))
    (tmp_path / "schema").mkdir()
    pq.write_table(t, tmp_path / "schema" / "a.parquet")
    pq.write_table(other, tmp_path / "schema" / "b.parquet", row_group_size=4)
    (tmp_path / "fields.csv").write_bytes(b"question,answer\nq0,a0\nq1,a1\nq2,a2,extra\nq3,a3\n")
    (tmp_path / "latin1.csv").write_bytes(b"question,answer\nq0,a0\nq1,caf\xe9\n")
    raw = pa.table({"question": ["q0", "q1", "q2"], "answer": pa.array([b"a0", b"a1", b"caf\xe9"], pa.binary())})
    pq.write_table(raw, tmp_path / "latin1.parquet", row_group_size=2)
    pq.write_table(pa.table({"question": ["q0", None], "answer": ["a0", "a1"]}), tmp_path / "null.parquet")
    table = lambda name, fmt="parquet", cols=QA: dt.TableDataSource({"train": str(tmp_path / name)}, fmt, cols)
    return {
        "footer": (table("truncated.parquet"), r"truncated.parquet: cannot read its footer \(truncated"),
        "empty": (table("empty.parquet"), r"empty.parquet is empty \(0 bytes\)"),
        "column": (
            table("good.parquet", cols={"inputs": "question", "targets": "answr"}),
            r"good.parquet has no column 'answr'; its columns: id, question, answer, score$",
        ),
        "schema": (table("schema/*.parquet"), r"b.parquet row group 0: column 'answer' is int64, .* has string"),
        "fields": (table("fields.csv", "csv"), r"fields.csv line 4: 3 fields, the header has 2$"),
        "utf8": (table("latin1.csv", "csv"), r"latin1.csv row 1: column 'answer' is not UTF-8 text"),
        "utf8_parquet": (
            table("latin1.parquet"),
            r"latin1.parquet row group 1 row 2: column 'answer' is not UTF-8 text \(unexpected end of data at byte 3",
        ),
        "null": (table("null.parquet"), r"null.parquet row group 0 row 1: column 'question' is null$"),
    }


def test_bad_inputs_are_one_line_and_leave_no_cache(lines, tmp_path):
    cache = tmp_path / "cache"
    good = dt.TableDataSource({"train": str(tmp_path / "qa.parquet")}, "parquet", QA)
    pq.write_table(_table(lines, 0, 50), tmp_path / "qa.parquet")
    assert cache_task_in_process(_task("good", good), "train", str(cache / "good"))
    before = {n: os.path.getmtime(cache / "good" / n) for n in os.listdir(cache / "good")}
    for case, (source, message) in _broken(tmp_path, lines).items():
        with pytest.raises(CorruptSourceError, match=message) as e:
            cache_task_in_process(_task(case, source), "train", str(cache / case))
        assert "\n" not in str(e.value) and not os.path.exists(cache / case), case  # no half-written cache
        if case in ("footer", "empty", "column"):  # found from the schemas alone, before any row is read
            with pytest.raises(CorruptSourceError, match=message):
                source.check("train")
    assert {n: os.path.getmtime(cache / "good" / n) for n in os.listdir(cache / "good")} == before
    # The file changes between caching and training: the cache is refused, naming the file.
    pq.write_table(_table(lines, 0, 51), tmp_path / "qa.parquet")
    with pytest.raises(CacheMismatchError, match=r"source file 'qa.parquet' .*changed since it was cached"):
        CachedTask(str(cache / "good"), _task("good", good))
    assert is_completed(str(cache / "good"))


@pytest.fixture(scope="module")
def bucket():
    from cairn.storage.testing import GcsEmulator

    emu = GcsEmulator().start()
    try:
        emu.activate()
        yield emu.create_bucket("tables")
    finally:
        emu.stop()


def test_sources_in_a_bucket_read_and_cache_on_beam_as_local_copies(tables, bucket, tmp_path):
    root, rows = tables
    for name in ["qa-0.parquet", "qa-1.parquet", "qa-0.csv", "qa-1.csv", "hf/dataset_dict.json"] + [
        f"hf/train/{n}" for n in os.listdir(root / "hf" / "train")
    ]:
        storage.copy_file(str(root / name), f"{bucket}/{name}")
    remote = {
        "parquet": dt.TableDataSource({"train": f"{bucket}/qa-*.parquet"}, "parquet", QA, splits=SPLITS),
        "hf": dt.TableDataSource.from_hf_folder(f"{bucket}/hf", QA, splits=SPLITS),
        "csv": dt.TableDataSource({"train": f"{bucket}/qa-*.csv"}, "csv", QA, splits=SPLITS),
    }
    for fmt, src in remote.items():
        src.check("train")
        assert _pairs(src.get_dataset("validation", shuffle=False)) == rows[270:], fmt
    local = dt.TableDataSource({"train": str(root / "qa-*.parquet")}, "parquet", QA, splits=SPLITS)
    assert source_description(_task("t", local), "train") == source_description(_task("t", remote["parquet"]), "train")
    # The Beam job (DirectRunner, in memory) reads the bucket: the records of the local in-process cache.
    assert cache_tasks(
        [_task("t", remote["parquet"])], str(tmp_path / "beam"), pipeline_options=["--runner=DirectRunner"]
    )
    assert cache_task_in_process(_task("t", local), "train", str(tmp_path / "local" / "t" / "train"))
    a = CachedTask(str(tmp_path / "beam" / "t" / "train"), _task("t", remote["parquet"]))
    b = CachedTask(str(tmp_path / "local" / "t" / "train"), _task("t", local))
    assert a.num_records == b.num_records == 270 and a.read(list(range(270))) == b.read(list(range(270)))
    # A bad row in the bucket, met by a Beam worker: the worker's one line, no cache left behind.
    storage.write_bytes(f"{bucket}/bad.csv", b"question,answer\nq0,a0\nq1,a1,x\n")
    bad = dt.TableDataSource({"train": f"{bucket}/bad.csv"}, "csv", QA)
    with pytest.raises(CorruptSourceError) as e:
        cache_tasks([_task("bad", bad)], str(tmp_path / "beam"), pipeline_options=["--runner=DirectRunner"])
    assert str(e.value) == f"CSV file {bucket}/bad.csv line 3: 3 fields, the header has 2"
    assert not os.path.exists(tmp_path / "beam" / "bad" / "train")
    # Beam's multi-process runners raise a RuntimeError holding the worker's traceback.
    beam_says = RuntimeError(
        f"Traceback ...\ncairn.datatasks.url_sources.CorruptSourceError: {e.value} [while running 'W']"
    )
    assert type(worker_error(beam_says)) is CorruptSourceError and str(worker_error(beam_says)) == str(e.value)
