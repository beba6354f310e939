"""Parity with seqio 0.0.20's feature converters, exactly, on the inputs of
`seqio_converter_golden.json` (written by tools/seqio_golden.py with seqio itself).

Where seqio ignores `loss_on_targets_only=False` (case `seqio_bug`), Cairn honours it: every
feature equals seqio's but `decoder_loss_weights`, which is 1 on every non-padding token.
"""

import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf
from data_util import as_lists, ids_dataset

import cairn.datatasks as dt
from cairn.datatasks import packing
from cairn.datatasks.ragged import Ragged

GOLDEN = json.loads((pathlib.Path(__file__).parent / "seqio_converter_golden.json").read_text())
CASES = {c["name"]: c for c in GOLDEN["cases"]}
# seqio's get_model_feature_lengths returns None for these; Cairn gives the lengths.
NO_SEQIO_LENGTHS = {"PassThroughFeatureConverter", "PrePackedLMFeatureConverter", "PrePackedPrefixLMFeatureConverter"}


def make(case):
    kwargs = dict(case["kwargs"])
    if case["passthrough_features"]:
        kwargs["passthrough_features"] = case["passthrough_features"]
    return getattr(dt, case["converter"])(**kwargs)


def run(case):
    ds = make(case)(ids_dataset(case["examples"]), case["task_feature_lengths"])
    return as_lists(ds)


def test_the_fixture_says_where_it_comes_from():
    assert GOLDEN["header"]["source"].startswith("seqio 0.0.20")
    assert "tools/seqio_golden.py" in GOLDEN["header"]["command"]
    converters = {c["converter"] for c in GOLDEN["cases"]}
    assert {
        "PrefixSuffixLMFeatureConverter",
        "DecoderFeatureConverter",
        "EncoderFeatureConverter",
        "PassThroughFeatureConverter",
        "PrePackedEncDecFeatureConverter",
        "PrePackedLMFeatureConverter",
        "PrePackedPrefixLMFeatureConverter",
    } <= converters


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c["error"] is None and not c["seqio_bug"]])
def test_outputs_equal_seqios(name):
    case = CASES[name]
    assert run(case) == case["output"]


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c["converter"] not in NO_SEQIO_LENGTHS])
def test_model_feature_lengths_equal_seqios(name):
    case = CASES[name]
    assert make(case).get_model_feature_lengths(case["task_feature_lengths"]) == case["model_feature_lengths"]


def test_model_feature_lengths_where_seqio_has_none():
    assert all(CASES[n]["model_feature_lengths"] is None for n in ("passthrough", "prepacked_lm"))
    lm = make(CASES["prepacked_lm"]).get_model_feature_lengths({"targets": 6})
    assert lm == dict.fromkeys(CASES["prepacked_lm"]["output"][0], 6)
    prefix = make(CASES["prepacked_prefix_lm"]).get_model_feature_lengths({"inputs": 2, "targets": 4})
    assert prefix == dict.fromkeys([*lm, "decoder_causal_attention"], 6)
    assert make(CASES["passthrough"]).get_model_feature_lengths({"inputs": 3}) == {"inputs": 3}


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c["seqio_bug"]])
def test_loss_on_targets_only_false_is_honoured(name):
    """seqio 0.0.20 resets the flag to True; Cairn keeps False: loss on every token."""
    case = CASES[name]
    assert case["seqio_bug"] == "loss_on_targets_only" and case["kwargs"]["loss_on_targets_only"] is False
    out = run(case)
    assert len(out) == len(case["output"])
    for ours, seqios in zip(out, case["output"], strict=True):
        assert {k: v for k, v in ours.items() if k != "decoder_loss_weights"} == {
            k: v for k, v in seqios.items() if k != "decoder_loss_weights"
        }
        assert ours["decoder_loss_weights"] == [int(t != 0) for t in ours["decoder_target_tokens"]]
    # seqio's weights leave the inputs out (equal only on rows without inputs).
    assert any(o["decoder_loss_weights"] != s["decoder_loss_weights"] for o, s in zip(out, case["output"]))
    # With the flag True Cairn gives seqio's weights (its only behaviour).
    honoured = dict(case, kwargs=dict(case["kwargs"], loss_on_targets_only=True))
    assert run(honoured) == case["output"]


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c["error"]])
def test_length_check_errors_name_the_feature(name):
    case = CASES[name]
    feature = case["error"].split("'")[1]  # seqio: "Feature 'inputs' has length ..."
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{case['converter']}: feature `{feature}` is longer"):
        run(case)


def test_length_check_off_trims_as_seqio():
    for name in [n for n in CASES if n.endswith("_check_False")]:
        assert CASES[name]["output"] and run(CASES[name]) == CASES[name]["output"], name


def test_missing_feature_is_named():
    with pytest.raises(dt.DataTasksError, match="no feature 'suffixes'"):
        dt.PrefixSuffixLMFeatureConverter()(
            ids_dataset([{"inputs": [1], "targets": [2]}]), CASES["decoder_packed_suffix"]["task_feature_lengths"]
        )
    with pytest.raises(dt.DataTasksError, match="missing \\['suffixes'\\]"):
        dt.PrefixSuffixLMFeatureConverter()(ids_dataset([{"inputs": [1], "targets": [2]}]), {"inputs": 2, "targets": 2})
    lm = CASES["prepacked_lm"]
    no_causal = [{k: v for k, v in e.items() if k != "decoder_causal_attention"} for e in lm["examples"]]
    with pytest.raises(dt.DataTasksError, match="no feature 'decoder_causal_attention'"):
        dt.PrePackedPrefixLMFeatureConverter()(ids_dataset(no_causal), {"inputs": 1, "targets": 5})
    with pytest.raises(dt.DataTasksError, match="missing \\['targets'\\]"):
        dt.PrePackedLMFeatureConverter()(ids_dataset(lm["examples"]), {"inputs": 6})


def test_prepacked_lm_length_check_is_exact():
    lm = CASES["prepacked_lm"]
    checked = dt.PrePackedLMFeatureConverter(apply_length_check=True)
    assert as_lists(checked(ids_dataset(lm["examples"]), {"targets": 6})) == lm["output"]
    with pytest.raises(tf.errors.InvalidArgumentError, match="`decoder_[a-z_]*` does not have its length 7"):
        as_lists(checked(ids_dataset(lm["examples"]), {"targets": 7}))
    padded = as_lists(dt.PrePackedLMFeatureConverter()(ids_dataset(lm["examples"]), {"targets": 8}))
    assert padded[0]["decoder_target_tokens"] == lm["output"][0]["decoder_target_tokens"] + [0, 0]


def test_prepacked_encdec_refuses_pack():
    with pytest.raises(dt.DataTasksError, match="pack=False"):
        dt.PrePackedEncDecFeatureConverter()
    assert not dt.PrePackedEncDecFeatureConverter(pack=False).pack


def test_decoder_chooses_by_the_lengths_keys():
    conv = dt.DecoderFeatureConverter(loss_on_targets_only=False, pack=False, bos_id=3)
    assert isinstance(conv.converter_for({"targets": 4}), dt.LMFeatureConverter)
    assert type(conv.converter_for({"inputs": 2, "targets": 4})) is dt.PrefixLMFeatureConverter
    chosen = conv.converter_for({"inputs": 2, "targets": 4, "suffixes": 1})
    assert isinstance(chosen, dt.PrefixSuffixLMFeatureConverter)
    assert not chosen.loss_on_targets_only and chosen.bos_id == 3 and not chosen.pack


@pytest.mark.parametrize("name", ["encoder_packed", "encoder_unpacked", "prepacked_encdec_bos"])
def test_numpy_conversion_equals_seqios(name):
    case = CASES[name]
    conv = make(case)
    assert conv.converts_numpy
    keys = conv.TASK_FEATURES
    lengths = case["task_feature_lengths"]
    feats = {k: Ragged.from_list([np.asarray(e[k][: lengths[k]], np.int32) for e in case["examples"]]) for k in keys}
    sizes = [len(case["examples"]) - 1, 1] if conv.pack else [1] * len(case["examples"])
    out = conv.convert_numpy(feats, np.asarray(sizes), lengths)
    assert [{k: v[r].tolist() for k, v in sorted(out.items())} for r in range(len(sizes))] == case["output"]


def test_numpy_length_check_names_the_feature():
    conv = dt.EncoderFeatureConverter(mask_id=9, pack=False, apply_length_check=True)
    feats = {k: Ragged.from_list([np.arange(1, 6, dtype=np.int32)]) for k in ("inputs", "targets")}
    with pytest.raises(dt.DataTasksError, match="feature 'inputs' is longer than its length 4"):
        conv.convert_numpy(feats, np.ones(1), {"inputs": 4, "targets": 8})
    assert conv.convert_numpy(feats, np.ones(1), {"inputs": 5, "targets": 5})["encoder_loss_weights"].sum() == 0


@pytest.mark.parametrize("name", ["prefix_suffix_lm_packed", "decoder_packed_suffix", "encoder_packed"])
def test_packing_units_plan_seqios_rows(name):
    """The rows a packing plan makes from `packing_units` are seqio's packed rows."""
    case = CASES[name]
    conv, lengths = make(case), case["task_feature_lengths"]
    counts = {k: np.array([len(e[k]) for e in case["examples"]]) for k in case["examples"][0]}
    units, capacity = conv.packing_units(counts, lengths)
    sizes = packing.greedy_row_sizes(units, capacity)
    assert len(sizes) == len(case["output"])
    segments = next(k for k in case["output"][0] if k.endswith("segment_ids"))
    assert sizes.tolist() == [max(row[segments]) for row in case["output"]]


SUFFIX_LENGTHS = {"inputs": 4, "targets": 3, "suffixes": 2, "extra": 4}
PASSTHROUGH = [
    (dt.PrefixSuffixLMFeatureConverter, {}, "prefix_suffix_lm_unpacked", SUFFIX_LENGTHS),
    (dt.EncoderFeatureConverter, {"mask_id": 9}, "encoder_unpacked", {"inputs": 11, "targets": 11, "extra": 4}),
    (dt.DecoderFeatureConverter, {}, "decoder_unpacked_suffix", SUFFIX_LENGTHS),
]


@pytest.mark.parametrize("cls, kwargs, name, lengths", PASSTHROUGH)
def test_passthrough_features_are_kept_padded(cls, kwargs, name, lengths):
    """seqio drops them in these converters; Cairn passes them through, padded."""
    conv = cls(pack=False, passthrough_features=["extra"], **kwargs)
    examples = [dict(e, extra=[7] * (i + 1)) for i, e in enumerate(CASES[name]["examples"])]
    out = as_lists(conv(ids_dataset(examples), lengths))
    assert [o["extra"] for o in out] == [[7] * (i + 1) + [0] * (3 - i) for i in range(len(examples))]
    assert conv.get_model_feature_lengths(lengths)["extra"] == 4


def test_apply_length_check_is_off_by_default():
    kinds = [dt.EncDecFeatureConverter(), dt.PrefixSuffixLMFeatureConverter(), dt.DecoderFeatureConverter()]
    kinds += [dt.EncoderFeatureConverter(9), dt.PassThroughFeatureConverter(), dt.PrePackedLMFeatureConverter()]
    assert not any(c.apply_length_check for c in kinds)
    assert dt.DecoderFeatureConverter(apply_length_check=True).converter_for({"targets": 1}).apply_length_check
