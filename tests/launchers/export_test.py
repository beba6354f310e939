"""`//launchers:export`: a checkpoint as a TensorFlow SavedModel served without JAX or Cairn,
compared with `infer` on the same text.

Two models, each exported in this process (`export.export`, what the program runs once its
flags are parsed) with greedy decoding and predicted by `infer` from the same `--input_file`
lines: the standard runs' checkpointed T5 run (tests/fixtures, trained 6 steps; exported again
with an `--input_length` wider than the config's, the same outputs), and a
decoder-only model (shakespeare_lm_tiny's network) whose checkpoint holds a LoRA run's adapters
(rank 2, given non-zero values) over a random-init base, so the export merges them as infer
does (with `long_inputs=refuse` and `--max_input_chars`); that model is exported again with
top-k and top-p sampling (the best of 2 samples) and with beam search, each with an
`--input_length` wider than infer's longest prompt, and their strings equal infer's for the same
seed (every row's budget and samples are its own); and a random-init Llama exported greedy,
sampled and by beam search, also wider, equal to infer. One child process, with `jax`, `jaxlib` and
`cairn` made unimportable before TensorFlow is imported (`serve_saved_model.py`), loads the
SavedModels and calls their signatures: the strings equal infer's predictions, the scores its
`aux.scores`; a too-long prompt, a too-long string, another rank and another dtype are refused.
The program refuses bad flags with one line and exit status 2 (a child process, before JAX is
imported).
"""

import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys

import launch_util
import numpy as np
import pytest
import standard_runs

HERE = pathlib.Path(__file__).absolute().parent
LINES = [
    "To be, or not to be, <extra_id_0> is the question:",
    "ROMEO. O, she doth teach the torches to burn bright!",
    "  Who's  there?",
    "Nay, answer me: stand, and unfold <extra_id_0>",
    "Long live the king!",
    "\uff26ull width letters and an \u00e9",
    "Well, good night. If you do meet Horatio and Marcellus, The rivals of my watch, bid them make haste.",
]
BATCH = 4  # rows per model call: 7 lines are two calls, the second padded
CHARS = 200  # the greedy decoder-only export's --max_input_chars


def _infer(spec, model_dir, out, input_file):
    from cairn.launchers import infer_main

    infer_main.infer(
        spec, str(out), str(model_dir), chunk_size=BATCH, input_file=str(input_file), mode="predict_with_aux"
    )
    return [json.loads(line) for line in out.read_text().splitlines()]


def _export(spec, model_dir, out):
    from cairn.launchers import export

    printed = []
    facts = export.export(spec, str(out), str(model_dir), batch_size=BATCH, out=printed.append)
    return facts, printed


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    path = tmp_path_factory.mktemp("inputs") / "lines.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def t5(tmp_path_factory, inputs):
    """The standard checkpointed T5 run, greedy: `(facts, printed, infer rows, SavedModel)`."""
    from cairn.launchers import config_io

    tmp = tmp_path_factory.mktemp("export_t5")
    std = standard_runs.unpack(tmp, checkpoints=True)
    model_dir = std.run(standard_runs.CHECKPOINTED)
    os.environ["CAIRN_SHAKESPEARE_DIR"] = std.texts
    config = config_io.resolve_paths(config_io.load_saved_config(str(model_dir / "config.json")))
    config.data.cache_dir = str(std.cache)
    config.post_training.decode_method = "greedy"
    spec = launch_util.spec(config)
    rows = _infer(spec, model_dir, tmp / "preds.jsonl", inputs)
    facts, printed = _export(spec, model_dir, tmp / "saved_model")
    from cairn.launchers import export

    # Exported wider than the config's inputs length (64): the encoder's padding changes nothing.
    export.export(spec, str(tmp / "wide"), str(model_dir), batch_size=BATCH, input_length=96, out=lambda _: None)
    return facts, printed, rows, tmp / "saved_model", tmp / "wide"


def _spec_of(tmp, model_dir, method="greedy", post=(), config_file=launch_util.LM_CONFIG, **lora):
    """A decoder-only config's spec (`config_file`'s) for `model_dir`, decoding 12 tokens by `method`
    (the config's sampling: temperature 0.8, top-k 40), with `post` post_training keys and LoRA keys."""
    from cairn.launchers import config_io

    config = config_io.resolve_paths(config_io.load_config_file(config_file))
    config.model_dir = str(model_dir)
    config.data.cache_dir = str(tmp / "cache")
    config.post_training.decode_method = method
    config.post_training.max_decode_length = 12
    for key, value in post:
        config.post_training[key] = value
    for key, value in lora.items():
        if key == "checkpoint":
            config.init.checkpoint = value
        else:
            config.model.lora[key] = value
    return launch_util.spec(config)


def _save_init(spec, change=lambda params: params):
    """A freshly initialized state of `spec` (its params through `change`) saved as step 1."""
    from cairn.launchers import builder, checkpoint_params, run_setup
    from cairn.trainer import Checkpointer

    ready = run_setup.prepare(spec, train=False, padded=(("chunk_size", BATCH),))
    model = builder.load_model(spec)
    trainer = builder.make_trainer(spec, builder.trainable_model(spec, model), ready.partitioner)
    rows = ready.partitioner.batch_parts() // ready.partitioner.data_layout().num_shards
    batch = checkpoint_params.zero_batch(spec, rows)
    trainer.setup(batch)
    state = trainer.initial_state(frozen=builder.base_params(spec, trainer, batch))
    state = state.replace(params=change(state.params))
    checkpointer = Checkpointer(spec.keys.model_dir, spec.checkpoint)
    try:
        checkpointer.save(1, state)
        checkpointer.wait()
    finally:
        checkpointer.close()


def _lora_checkpoint(tmp: pathlib.Path):
    """A LoRA run's checkpoint over a random-init base (both saved here, no training): the spec of
    the LoRA run and its model_dir. The adapters' B kernels are made non-zero, so that the merged
    weights differ from the base."""
    import jax

    base = tmp / "base"
    _save_init(_spec_of(tmp, base))
    lora = {"rank": 2, "alpha": 4.0, "checkpoint": str(base / "checkpoints" / "1")}
    spec = _spec_of(tmp, tmp / "lora", post=[("long_inputs", "refuse")], **lora)
    keys = iter(jax.random.split(jax.random.PRNGKey(1), 1000))

    def nonzero(params):
        return jax.tree.map(lambda p: p + 0.05 * jax.random.normal(next(keys), p.shape, p.dtype), params)

    _save_init(spec, nonzero)
    sampled = _spec_of(tmp, tmp / "lora", "sample", [("top_p", 0.9), ("num_decodes", 2)], **lora)
    beam = _spec_of(tmp, tmp / "lora", "beam", [("num_beams", 3), ("alpha", 0.6), ("num_decodes", 2)], **lora)
    return {"greedy": spec, "sample": sampled, "beam": beam}, tmp / "lora"


def _exported_wider(tmp, specs, model_dir, inputs, widths, chars=lambda name: 0):
    """Each `{name: spec}` inferred and exported `widths[name]` tokens wider than the longest
    prompt: `{name: (facts, infer rows, SavedModel)}`."""
    from cairn.launchers import export

    prompt = max(len(next(iter(specs.values())).vocabulary.encode(line)) for line in LINES)
    out = {}
    for name, s in specs.items():
        rows = _infer(s, model_dir, tmp / f"{name}.jsonl", inputs)
        saved = tmp / f"saved_{name}"
        facts = export.export(
            s,
            str(saved),
            str(model_dir),
            batch_size=BATCH,
            input_length=prompt + widths[name],
            out=lambda _: None,
            max_input_chars=chars(name),
        )
        out[name] = (facts, rows, saved)
    return out


@pytest.fixture(scope="module")
def lm(tmp_path_factory, inputs):
    """A decoder-only LoRA checkpoint: `{method: (facts, infer rows, SavedModel)}`; sampling and
    beam search exported wider than the longest prompt."""
    tmp = tmp_path_factory.mktemp("export_lm")
    os.environ["CAIRN_SHAKESPEARE_DIR"] = launch_util.small_texts(tmp)
    specs, model_dir = _lora_checkpoint(tmp)
    widths = {"greedy": 0, "sample": 6, "beam": 3}
    return _exported_wider(tmp, specs, model_dir, inputs, widths, lambda name: CHARS if name == "greedy" else 0)


@pytest.fixture(scope="module")
def llama(tmp_path_factory, inputs):
    """A random-init Llama (shakespeare_llama_tiny's network: RoPE, grouped-query heads), greedy,
    sampled and by beam search, each exported 5 tokens wider than the longest prompt."""
    tmp = tmp_path_factory.mktemp("export_llama")
    os.environ["CAIRN_SHAKESPEARE_DIR"] = launch_util.small_texts(tmp)
    config = str(launch_util.CONFIGS / "shakespeare_llama_tiny.py")
    model_dir = tmp / "llama"
    _save_init(_spec_of(tmp, model_dir, config_file=config))
    specs = {name: _spec_of(tmp, model_dir, name, config_file=config) for name in ("greedy", "sample")}
    specs["beam"] = _spec_of(tmp, model_dir, "beam", [("num_beams", 3), ("alpha", 0.6)], config_file=config)
    return _exported_wider(tmp, specs, model_dir, inputs, {"greedy": 5, "sample": 5, "beam": 5})


@pytest.fixture(scope="module")
def served(t5, lm, llama, tmp_path_factory):
    """Both SavedModels called in one TensorFlow-only child process: `{name: answer}` and the
    modules it kept out."""
    tmp = tmp_path_factory.mktemp("serve")
    requests = [
        {"path": str(t5[3]), "signature": "serving_default", "inputs": LINES},
        {"path": str(lm["greedy"][2]), "signature": "serving_default", "inputs": LINES},
        {"path": str(lm["greedy"][2]), "signature": "generate", "inputs": LINES[:2], "seed": 7},
        {"path": str(t5[3]), "signature": "serving_default", "inputs": []},
        {"path": str(lm["sample"][2]), "signature": "serving_default", "inputs": LINES},
        {"path": str(lm["sample"][2]), "signature": "generate", "inputs": LINES, "seed": 0},
        {"path": str(lm["sample"][2]), "signature": "generate", "inputs": LINES, "seed": 5},
        {"path": str(lm["beam"][2]), "signature": "serving_default", "inputs": LINES},
        # Refused: a prompt longer than --input_length (long_inputs=refuse), a string over
        # --max_input_chars, another rank, another dtype.
        {"path": str(lm["greedy"][2]), "signature": "serving_default", "inputs": [LINES[0], LINES[-1] + " O" * 30]},
        {"path": str(lm["greedy"][2]), "signature": "serving_default", "inputs": ["x" * (CHARS + 1)]},
        {"path": str(lm["greedy"][2]), "signature": "serving_default", "inputs": [LINES[:2]]},
        {"path": str(lm["greedy"][2]), "signature": "serving_default", "inputs": [1, 2], "dtype": "int32"},
        {"path": str(t5[4]), "signature": "serving_default", "inputs": LINES},
        {"path": str(llama["greedy"][2]), "signature": "serving_default", "inputs": LINES},
        {"path": str(llama["sample"][2]), "signature": "serving_default", "inputs": LINES},
        {"path": str(llama["beam"][2]), "signature": "serving_default", "inputs": LINES},
    ]
    (tmp / "requests.json").write_text(json.dumps(requests))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH="")
    proc = subprocess.run(
        [sys.executable, str(HERE / "serve_saved_model.py"), str(tmp / "requests.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    names = ("t5", "lm", "lm_seeded", "empty", "sampled", "sampled_seed_0", "sampled_seed_5", "beam")
    names += ("too_long", "too_many_chars", "rank_2", "int32", "t5_wide", "llama", "llama_sampled", "llama_beam")
    return dict(zip(names, answer["answers"], strict=True)), answer["blocked"]


def _same_as_infer(rows, answer):
    # infer skips blank lines; none here, so rows are the lines in order.
    assert [r["input"] for r in rows] == LINES
    assert answer["outputs"] == [r["prediction"] for r in rows]
    for ids, row in zip(answer["output_ids"], rows):
        assert [t for t in ids if t] == row["prediction_ids"]
    np.testing.assert_allclose(answer["scores"], [r["aux"]["scores"] for r in rows], rtol=1e-4, atol=1e-4)


def test_t5_saved_model_equals_infer(t5, served):
    facts, printed, rows, path, _ = t5
    answers, blocked = served
    assert blocked == ["cairn", "jax", "jaxlib"]  # the server never imported them
    _same_as_infer(rows, answers["t5"])
    _same_as_infer(rows, answers["t5_wide"])  # --input_length 96: the same strings and scores
    assert any(r["prediction"] for r in rows)
    assert facts["step"] == 6 and facts["decode"]["method"] == "greedy" and facts["add_eos"] is True
    assert (facts["batch_size"], facts["input_length"], facts["max_decode_length"]) == (BATCH, 64, 16)
    assert json.loads((path / "assets.extra" / "cairn_export.json").read_text()) == facts
    assets = sorted(p.name for p in (path / "assets").iterdir())
    model = (path / "assets" / "vocabulary.model").read_bytes()
    assert assets == ["vocabulary.model"] and hashlib.sha256(model).hexdigest() == facts["vocabulary_sha256"]
    assert printed == [f"exported step 6 of {facts['checkpoint']} to {path} (encoder_decoder, greedy)"]
    assert answers["empty"] == {"outputs": [], "scores": [], "output_ids": []}


def test_decoder_only_lora_saved_model_equals_infer(lm, served):
    facts, rows, _ = lm["greedy"]
    answers, _ = served
    _same_as_infer(rows, answers["lm"])
    assert facts["model_kind"] == "decoder_only" and facts["add_eos"] is False
    # `generate` with another seed: greedy ignores it.
    assert answers["lm_seeded"]["outputs"] == answers["lm"]["outputs"][:2]


def test_sampling_seeded_as_infer(lm, served):
    """Top-k and top-p sampling, the best of 2 samples (whose `lax.top_k` TensorFlow 2.21 reads
    only in the older StableHLO the export writes), exported 6 tokens wider than infer's longest
    prompt: the config's seed gives infer's strings; `generate` takes another seed."""
    facts, rows, _ = lm["sample"]
    answers, _ = served
    decode = facts["decode"]
    assert (decode["method"], decode["top_k"], decode["top_p"], decode["num_decodes"]) == ("sample", 40, 0.9, 2)
    assert facts["seed"] == 0 and facts["input_length"] == lm["greedy"][0]["input_length"] + 6
    _same_as_infer(rows, answers["sampled"])
    for row in rows:  # infer's aux lists both samples; the prediction is the likelier
        decodes = row["aux"]["decodes"]
        assert len(decodes) == 2 and row["aux"]["scores"] == max(d["score"] for d in decodes)
        assert row["prediction_ids"] in [d["prediction_ids"] for d in decodes]
    assert any(row["aux"]["decodes"][0] != row["aux"]["decodes"][1] for row in rows)
    assert answers["sampled_seed_0"] == answers["sampled"]
    assert answers["sampled_seed_5"]["outputs"] != answers["sampled"]["outputs"]


def test_beam_search_exported_wider_equals_infer(lm, served):
    """Beam search (3 beams, alpha 0.6, the best of 2 returned) exported 3 tokens wider than
    infer's longest prompt: infer's strings and scores (each row's budget is its own)."""
    facts, rows, _ = lm["beam"]
    answers, _ = served
    assert (facts["decode"]["num_beams"], facts["decode"]["alpha"], facts["decode"]["num_decodes"]) == (3, 0.6, 2)
    _same_as_infer(rows, answers["beam"])


def test_the_served_model_refuses_long_or_malformed_inputs(lm, served):
    """`long_inputs=refuse`: a prompt over `--input_length` tokens fails naming its index; a string
    over `--max_input_chars` fails before it is tokenized; another rank fails saying what the
    input must be; another dtype is refused by TensorFlow before the graph runs."""
    facts = lm["greedy"][0]
    answers, _ = served
    assert (facts["long_inputs"], facts["max_input_chars"]) == ("refuse", CHARS)
    width = facts["input_length"]
    assert answers["too_long"]["error"].startswith("InvalidArgumentError")
    assert re.search(rf"input.*1.*has.*tokens.*more than {width}", answers["too_long"]["error"])
    assert re.search(rf"input.*0.*has.*{CHARS + 1}.*characters.*more than {CHARS}", answers["too_many_chars"]["error"])
    assert re.search(
        r"inputs must be a vector of strings \(rank 1, shape \[n\]\); got rank\W+2", answers["rank_2"]["error"]
    )
    assert "expected to be a string tensor but is a int32 tensor" in answers["int32"]["error"]


def test_bad_flags_exit_2_with_one_line(tmp_path):
    from cairn.launchers import export
    from cairn.launchers.validation import ConfigError

    existing = tmp_path / "taken"
    existing.mkdir()
    out = str(tmp_path / "x")
    cases = {
        "output": ("", 8, 0, ["cpu"], False),
        "batch_size": (out, 0, 0, ["cpu"], False),
        "input_length": (out, 8, -1, ["cpu"], False),
        "platforms": (out, 8, 0, ["cpu", "gpu"], False),
        "max_input_chars": (out, 8, 0, ["cpu"], False, -1),
    }
    for key, args in cases.items():
        with pytest.raises(ConfigError) as refused:
            export.check_args(*args)
        assert refused.value.key == key, (key, refused.value)
    with pytest.raises(ConfigError, match="exists; use --overwrite"):
        export.check_args(str(existing), 8, 0, ["cpu"], False)
    export.check_args(str(existing), 8, 0, ["cpu"], True)
    # The program: one line, exit 2, before JAX is imported.
    proc = launch_util.run(
        "cairn.launchers.export", [f"--config={launch_util.T5_CONFIG}", "--batch_size=0", f"--output={out}"]
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "batch_size" in lines[0], launch_util.tail(proc)


def test_llama_exported_wider_equals_infer(llama, served):
    """Llama greedy, sampled (the config's top-k 40, temperature 0.8) and by beam search (3 beams,
    alpha 0.6), exported 5 tokens wider than infer's longest prompt: infer's strings and scores."""
    answers, _ = served
    for name, answer in (("greedy", "llama"), ("sample", "llama_sampled"), ("beam", "llama_beam")):
        facts, rows, _ = llama[name]
        assert facts["model_kind"] == "llama" and facts["decode"]["method"] == name
        assert any(r["prediction"] for r in rows)
        _same_as_infer(rows, answers[answer])
