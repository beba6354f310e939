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


# converter -> (extra flags, the task features it reads, a model feature it prints, its class)
_DECODER = ["decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights", "decoder_segment_ids"]
_PACKED = ["inputs_segment_ids", "inputs_positions", "targets_segment_ids", "targets_positions"]
NEW_CONVERTERS = {
    "prefix_suffix_lm": (
        [],
        ["inputs", "targets", "suffixes"],
        "target_suffix_weights",
        dt.PrefixSuffixLMFeatureConverter,
    ),
    # `suffixes` has a length, so Decoder converts as PrefixSuffixLM
    "decoder": ([], ["inputs", "targets", "suffixes"], "target_suffix_weights", dt.DecoderFeatureConverter),
    "encoder": (["--mask_id", "6"], ["inputs", "targets"], "encoder_loss_weights", dt.EncoderFeatureConverter),
    "pass_through": ([], ["inputs", "inputs_segment_ids"], "inputs_segment_ids", dt.PassThroughFeatureConverter),
    "prepacked_encdec": (
        [],
        ["inputs", "targets", *_PACKED],
        "encoder_segment_ids",
        dt.PrePackedEncDecFeatureConverter,
    ),
    "prepacked_lm": (
        [],
        ["targets", *_DECODER, "decoder_positions"],
        "decoder_positions",
        dt.PrePackedLMFeatureConverter,
    ),
    "prepacked_prefix_lm": (
        [],
        ["inputs", "targets", *_DECODER, "decoder_positions", "decoder_causal_attention"],
        "decoder_causal_attention",
        dt.PrePackedPrefixLMFeatureConverter,
    ),
}


@pytest.fixture
def ids_task_file(tmp_path):
    """Tasks `ids_<converter>`: one example of ids with just the features that converter
    reads (fewer features trace faster)."""
    module = tmp_path / "id_tasks.py"
    needs = {name: features for name, (_, features, _, _) in NEW_CONVERTERS.items()}
    module.write_text(
        textwrap.dedent(f"""
        import tensorflow as tf
        import cairn.datatasks as dt
        from cairn.tokenizers import PassThroughVocabulary

        EXAMPLE = {{
            "inputs": [5, 6, 7, 8], "targets": [9, 4], "suffixes": [3],
            "inputs_segment_ids": [1, 1, 2, 2], "inputs_positions": [0, 1, 0, 1],
            "targets_segment_ids": [1, 2], "targets_positions": [0, 0],
            "decoder_target_tokens": [9, 4, 7], "decoder_input_tokens": [0, 9, 0],
            "decoder_loss_weights": [1, 1, 1], "decoder_segment_ids": [1, 1, 2],
            "decoder_positions": [0, 1, 0], "decoder_causal_attention": [1, 0, 1],
        }}
        vocab = PassThroughVocabulary(100, eos_id=1)
        for name, keys in {needs!r}.items():
            example = {{k: EXAMPLE[k] for k in keys}}
            dt.TaskRegistry.add(
                "ids_" + name,
                dt.FunctionDataSource(
                    lambda split, shuffle_files, example=example: tf.data.Dataset.from_tensors(
                        {{k: tf.constant(v, tf.int32) for k, v in example.items()}}),
                    ["train"]),
                {{k: dt.Feature(vocab, add_eos=False) for k in keys}},
                [])
    """)
    )
    yield str(module)
    for name in NEW_CONVERTERS:
        if f"ids_{name}" in dt.TaskRegistry.names():
            dt.TaskRegistry.remove(f"ids_{name}")


def test_converter_choices_are_every_converter():
    assert set(inspect_tool.CONVERTERS) == {"encdec", "lm", "prefix_lm", *NEW_CONVERTERS}
    assert {name: inspect_tool.CONVERTERS[name] for name in NEW_CONVERTERS} == {
        name: cls for name, (_, _, _, cls) in NEW_CONVERTERS.items()
    }


# The tool runs every converter by the same code (the class its name maps to, checked above, on
# the task's examples); one prepacked converter stands for the three, and `decoder` (which
# converts this task as PrefixSuffixLM: it has `suffixes`) for `prefix_suffix_lm` (the converters
# themselves are compared with seqio's in seqio_converters_test).
@pytest.mark.parametrize(
    "name", sorted(set(NEW_CONVERTERS) - {"prepacked_lm", "prepacked_prefix_lm", "prefix_suffix_lm"})
)
def test_each_converter_runs_on_a_tiny_task(ids_task_file, capsys, name):
    flags, _, feature, cls = NEW_CONVERTERS[name]
    rc = inspect_tool.main(
        ["--module_file", ids_task_file, "--task", f"ids_{name}", "--n", "1", "--converter", name, *flags]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert f"converter {cls.__name__}(" in out
    converted = out.split("[converted]")[1]
    assert feature in converted
    if name == "encoder":  # loss where the inputs hold the mask id 6: [5, 6, 7, 8] -> [0, 1, 0, 0]
        assert "encoder_loss_weights    ids(512) [0, 1, 0, 0, 0" in converted


def test_encoder_needs_a_mask_id(ids_task_file):
    with pytest.raises(SystemExit, match="--mask_id"):
        inspect_tool.main(["--module_file", ids_task_file, "--task", "ids_encoder", "--converter", "encoder"])
