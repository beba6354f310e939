"""Writes tests/datatasks/seqio_converter_golden.json: seqio's feature converters' outputs.

Runs seqio's converters on fixed inputs (packed and unpacked, each constructor option) and
records their exact outputs, model feature lengths and errors; the CI test
(tests/datatasks/seqio_converters_test.py, no seqio) compares Cairn's converters with them.
Run with the peer venv (benchmarks/setup_peers.sh), never with .venv:

    /work/peer-venv/bin/python tools/seqio_golden.py   # or .peer-venv/bin/python
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

import numpy as np
import seqio
import tensorflow as tf

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "datatasks" / "seqio_converter_golden.json"
COMMAND = "/work/peer-venv/bin/python tools/seqio_golden.py"

# Fixed inputs. Ids are non-zero (0 is padding); some features are empty on purpose.
ENCDEC = [
    {"inputs": [7, 8, 5, 1], "targets": [3, 9, 1]},
    {"inputs": [8, 4, 9, 3, 1], "targets": [4, 1]},
    {"inputs": [2, 6, 1], "targets": [5, 5, 7, 1]},
]
LM = [{"targets": [3, 9, 1]}, {"targets": [4, 1]}, {"targets": [6, 2, 8, 7, 1]}]
PREFIX = [
    {"inputs": [9, 4, 6, 1], "targets": [3, 9, 1]},
    {"inputs": [3, 2], "targets": [4, 1]},
    {"inputs": [], "targets": [5, 7, 1]},
]
SUFFIX = [
    {"inputs": [9, 4, 6], "targets": [3, 9], "suffixes": [2, 1]},
    {"inputs": [3, 2], "targets": [4], "suffixes": []},
    {"inputs": [], "targets": [5, 7], "suffixes": [8, 1]},
    {"inputs": [6], "targets": [], "suffixes": []},
]
ENCODER = [
    {"inputs": [8, 9, 9, 3, 4, 1], "targets": [8, 7, 4, 3, 4, 1]},
    {"inputs": [8, 3, 9, 1], "targets": [8, 3, 6, 1]},
    {"inputs": [8, 9, 1], "targets": [8, 2, 1]},
]
PREPACKED_ENCDEC = [
    {
        "inputs": [7, 8, 5, 1, 8, 4, 1],
        "inputs_segment_ids": [1, 1, 1, 1, 2, 2, 2],
        "inputs_positions": [0, 1, 2, 3, 0, 1, 2],
        "targets": [3, 9, 1, 4, 1],
        "targets_segment_ids": [1, 1, 1, 2, 2],
        "targets_positions": [0, 1, 2, 0, 1],
    },
    {
        "inputs": [2, 6, 1],
        "inputs_segment_ids": [1, 1, 1],
        "inputs_positions": [0, 1, 2],
        "targets": [5, 1],
        "targets_segment_ids": [1, 1],
        "targets_positions": [0, 1],
    },
]
LM_FEATURES = ["decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights"]
PACKED_LM = ["decoder_positions", "decoder_segment_ids"]
PREPACKED_LM = [
    {
        "decoder_target_tokens": [3, 9, 1, 4, 1, 0],
        "decoder_input_tokens": [0, 3, 9, 0, 4, 0],
        "decoder_loss_weights": [1, 1, 1, 1, 1, 0],
        "decoder_positions": [0, 1, 2, 0, 1, 0],
        "decoder_segment_ids": [1, 1, 1, 2, 2, 0],
        "decoder_causal_attention": [1, 1, 0, 1, 0, 0],
        "extra": [5, 5, 5, 5, 5, 5],
    }
]


def case(name, converter, examples, lengths, passthrough=(), seqio_bug="", **kwargs):
    return {
        "name": name,
        "converter": converter,
        "kwargs": kwargs,
        "passthrough_features": list(passthrough),
        "examples": examples,
        "task_feature_lengths": lengths,
        "seqio_bug": seqio_bug,
    }


def cases() -> list[dict]:
    out = []
    for pack in (False, True):
        p = "packed" if pack else "unpacked"
        out += [
            case(f"encdec_{p}", "EncDecFeatureConverter", ENCDEC, {"inputs": 10, "targets": 7}, pack=pack),
            case(
                f"encdec_{p}_bos", "EncDecFeatureConverter", ENCDEC, {"inputs": 10, "targets": 7}, pack=pack, bos_id=3
            ),
            case(f"lm_{p}", "LMFeatureConverter", LM, {"targets": 8}, pack=pack),
            case(f"prefix_lm_{p}", "PrefixLMFeatureConverter", PREFIX, {"inputs": 5, "targets": 4}, pack=pack),
            case(
                f"prefix_lm_{p}_all_loss",
                "PrefixLMFeatureConverter",
                PREFIX,
                {"inputs": 5, "targets": 4},
                pack=pack,
                loss_on_targets_only=False,
            ),
            case(
                f"encoder_{p}", "EncoderFeatureConverter", ENCODER, {"inputs": 11, "targets": 11}, pack=pack, mask_id=9
            ),
        ]
        sfx = {"inputs": 4, "targets": 3, "suffixes": 2}
        out += [
            case(f"prefix_suffix_lm_{p}", "PrefixSuffixLMFeatureConverter", SUFFIX, sfx, pack=pack),
            case(f"prefix_suffix_lm_{p}_bos", "PrefixSuffixLMFeatureConverter", SUFFIX, sfx, pack=pack, bos_id=2),
            case(
                f"prefix_suffix_lm_{p}_all_loss",
                "PrefixSuffixLMFeatureConverter",
                SUFFIX,
                sfx,
                pack=pack,
                loss_on_targets_only=False,
                seqio_bug="loss_on_targets_only",
            ),
            case(f"decoder_{p}_lm", "DecoderFeatureConverter", LM, {"targets": 8}, pack=pack),
            case(f"decoder_{p}_prefix", "DecoderFeatureConverter", PREFIX, {"inputs": 5, "targets": 4}, pack=pack),
            case(
                f"decoder_{p}_prefix_all_loss",
                "DecoderFeatureConverter",
                PREFIX,
                {"inputs": 5, "targets": 4},
                pack=pack,
                loss_on_targets_only=False,
            ),
            case(f"decoder_{p}_suffix", "DecoderFeatureConverter", SUFFIX, sfx, pack=pack),
            case(
                f"decoder_{p}_suffix_all_loss",
                "DecoderFeatureConverter",
                SUFFIX,
                sfx,
                pack=pack,
                loss_on_targets_only=False,
                seqio_bug="loss_on_targets_only",
            ),
        ]
    # Length checks: over-long features raise with apply_length_check=True, are trimmed without.
    long_encdec = [{"inputs": [7, 8, 5, 1, 2, 3], "targets": [3, 9, 1]}]
    for conv, kw in (("EncDecFeatureConverter", {}), ("EncoderFeatureConverter", {"mask_id": 9})):
        for check in (True, False):
            out.append(
                case(
                    f"{conv}_overlong_inputs_check_{check}",
                    conv,
                    long_encdec,
                    {"inputs": 4, "targets": 4},
                    pack=False,
                    apply_length_check=check,
                    **kw,
                )
            )
    long_suffix = [{"inputs": [9, 4], "targets": [3], "suffixes": [2, 6, 1]}]
    for check in (True, False):
        out.append(
            case(
                f"prefix_suffix_lm_overlong_suffixes_check_{check}",
                "PrefixSuffixLMFeatureConverter",
                long_suffix,
                {"inputs": 3, "targets": 3, "suffixes": 2},
                pack=False,
                apply_length_check=check,
            )
        )
    # Pass-through features (unpacked only, as in seqio).
    with_extra = [dict(e, extra=[i + 1] * (i + 2)) for i, e in enumerate(ENCDEC)]
    out.append(
        case(
            "encdec_passthrough",
            "EncDecFeatureConverter",
            with_extra,
            {"inputs": 10, "targets": 7, "extra": 5},
            passthrough=["extra"],
            pack=False,
        )
    )
    with_extra = [dict(e, extra=[i + 1] * (i + 2)) for i, e in enumerate(PREFIX)]
    out.append(
        case(
            "prefix_lm_passthrough",
            "PrefixLMFeatureConverter",
            with_extra,
            {"inputs": 5, "targets": 4, "extra": 5},
            passthrough=["extra"],
            pack=False,
        )
    )
    # Pre-packed and pass-through converters.
    out += [
        case("passthrough", "PassThroughFeatureConverter", ENCDEC, {"inputs": 10, "targets": 7}),
        case("prepacked_encdec", "PrePackedEncDecFeatureConverter", PREPACKED_ENCDEC, {
            "inputs": 8, "targets": 6, "inputs_segment_ids": 8, "inputs_positions": 8,
            "targets_segment_ids": 6, "targets_positions": 6}, pack=False),
        case("prepacked_encdec_bos", "PrePackedEncDecFeatureConverter", PREPACKED_ENCDEC, {
            "inputs": 8, "targets": 6, "inputs_segment_ids": 8, "inputs_positions": 8,
            "targets_segment_ids": 6, "targets_positions": 6}, pack=False, bos_id=4),
        case("prepacked_lm", "PrePackedLMFeatureConverter", PREPACKED_LM, {"targets": 6}),
        case("prepacked_prefix_lm", "PrePackedPrefixLMFeatureConverter", PREPACKED_LM, {"inputs": 2, "targets": 4}),
    ]  # fmt: skip
    return out


def dataset(examples: list[dict]) -> tf.data.Dataset:
    keys = list(examples[0])
    ragged = {k: tf.ragged.constant([e[k] for e in examples], dtype=tf.int32, row_splits_dtype=tf.int64) for k in keys}
    return tf.data.Dataset.from_tensor_slices(ragged).map(dict)


def run(c: dict) -> dict:
    kwargs = dict(c["kwargs"])
    if c["passthrough_features"]:
        spec = seqio.FeatureConverter.FeatureSpec(dtype=tf.int32)
        kwargs["passthrough_features"] = {k: spec for k in c["passthrough_features"]}
    conv = getattr(seqio, c["converter"])(**kwargs)
    lengths = c["task_feature_lengths"]
    result = dict(c)
    try:
        ds = conv(dataset(c["examples"]), lengths)
        result["output"] = [{k: np.asarray(v).tolist() for k, v in sorted(ex.items())} for ex in ds.as_numpy_iterator()]
        result["error"] = None
    except (tf.errors.InvalidArgumentError, ValueError) as e:
        result["output"] = None
        found = re.search(r"\[(Feature [^\]]*)\]", str(e))
        message = found.group(1).replace("\\'", "'") if found else str(e).splitlines()[0][:300]
        result["error"] = f"{type(e).__name__}: {message}"
    mfl = conv.get_model_feature_lengths(lengths)
    result["model_feature_lengths"] = None if mfl is None else dict(sorted(mfl.items()))
    return result


def main() -> int:
    results = [run(c) for c in cases()]
    doc = {
        "header": {
            "source": f"seqio {seqio.__version__} (tensorflow {tf.__version__}), its real converters",
            "command": COMMAND,
            "note": (
                "seqio_bug marks cases where seqio 0.0.20 ignores a constructor argument "
                "(PrefixSuffixLMFeatureConverter resets loss_on_targets_only to True); the output "
                "recorded is seqio's, and the test asserts Cairn's documented difference. "
                "model_feature_lengths null: seqio's get_model_feature_lengths returns None."
            ),
        },
        "cases": results,
    }
    # One case a line: reviewable diffs without a 100 kB file.
    lines = ",\n".join(json.dumps(c, sort_keys=True) for c in results)
    OUT.write_text(f'{{"header": {json.dumps(doc["header"], indent=1)},\n"cases": [\n{lines}\n]}}\n')
    print(f"wrote {len(results)} cases to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
