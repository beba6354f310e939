"""The inspect tool: raw, preprocessed and converted examples, ids beside text."""

import textwrap

import pytest

import cairn.datatasks as dt
from cairn.datatasks import inspect as inspect_tool


@pytest.fixture
def task_file(tmp_path, sp_vocab):
    data = tmp_path / "lines.txt"
    data.write_text("to be or not to be\n\nthat is the question\n", encoding="utf-8")
    module = tmp_path / "my_tasks.py"
    module.write_text(
        textwrap.dedent(f"""
        import cairn.datatasks as dt
        from cairn.datatasks import preprocessors as pp
        from cairn.tokenizers import SentencePieceVocabulary

        vocab = SentencePieceVocabulary({sp_vocab.path!r}, extra_ids=100)
        dt.TaskRegistry.add(
            "inspect_demo", dt.TextLineDataSource({{"train": {str(data)!r}}}),
            {{"inputs": dt.Feature(vocab), "targets": dt.Feature(vocab)}},
            [lambda ds: ds.map(lambda s: {{"inputs": s, "targets": s}}), pp.tokenize,
             pp.append_eos_after_trim])
    """)
    )
    yield str(module)
    if "inspect_demo" in dt.TaskRegistry.names():
        dt.TaskRegistry.remove("inspect_demo")


def test_prints_raw_preprocessed_and_converted(task_file, capsys, sp_vocab):
    rc = inspect_tool.main(
        ["--module_file", task_file, "--task", "inspect_demo", "--n", "2", "--sequence_length", "inputs=8,targets=8"]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert out.count("[raw]") == 2 and out.count("[preprocessed]") == 2
    assert out.count("[converted]") == 2
    assert "'to be or not to be'" in out
    ids = sp_vocab.encode("to be or not to be")[:7] + [sp_vocab.eos_id]
    assert f"ids(8) {ids}" in out
    assert "encoder_input_tokens" in out and "decoder_loss_weights" in out
    assert "text 'to be or" in out
    assert "bad data (examples read so far): {'empty_line': 1}" in out


def test_unknown_task_suggests_names(task_file, capsys):
    rc = inspect_tool.main(["--module_file", task_file, "--task", "inspect_dmeo"])
    assert rc == 2
    assert "'inspect_demo'" in capsys.readouterr().err


def test_bad_flags_fail_clearly(task_file, capsys):
    with pytest.raises(SystemExit):
        inspect_tool.main(["--task", "x", "--sequence_length", "inputs=abc"])
    with pytest.raises(SystemExit, match="not found"):
        inspect_tool.main(["--task", "x", "--module_file", "/nonexistent/tasks.py"])
    with pytest.raises(SystemExit, match="no split 'test'"):
        inspect_tool.main(["--module_file", task_file, "--task", "inspect_demo", "--split", "test"])
