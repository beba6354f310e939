"""The interactive handle (`cairn.launchers.interactive.InteractiveModel`) against infer, on
the same strings: its `predict` strings are infer's predictions and its `score` infer's
`--mode=score` (infer given the strings as a `.jsonl` `--input_file`, in this process), for the
standard checkpointed T5 run (tests/fixtures: `from_run` on its model_dir) and for a decoder-only
model the handle trains, saves and infer reads back (its sampled decoding, the config's, equal
too). `train_step` changes the params and lowers the loss on repeated examples, and a later
`predict` / `score` sees the update; a LoRA handle trains its adapters only, starting from the
base's predictions. Bad input (an empty list, wrong types, a missing checkpoint, a folder that is
no run) is a clear error. `evaluate` (eval's code) gives the run's own final evaluation."""

import json
import logging
import os
from unittest import mock

import jax
import launch_util
import numpy as np
import pytest
import standard_runs

from cairn.launchers.interactive import InteractiveModel
from cairn.launchers.validation import ConfigError

INPUTS = ["To be, or not to be, that is the question", "Thou art more lovely", "Good night, sweet prince", "O"]
TARGETS = ["whether 'tis nobler in the mind", "and more temperate", "and flights of angels", "Romeo"]
BATCH = 4  # the handle's batch and infer's chunk: the same programs on the same rows


@pytest.fixture(scope="module")
def std(tmp_path_factory):
    """The standard runs (tests/fixtures) with the checkpointed T5 run's checkpoints, and the
    environment infer reads its texts with."""
    std = standard_runs.unpack(tmp_path_factory.mktemp("interactive"), checkpoints=True)
    with mock.patch.dict(os.environ, {"CAIRN_SHAKESPEARE_DIR": std.texts}):
        yield std


def _jsonl(path, inputs, targets):
    path.write_text("".join(json.dumps({"input": i, "target": t}) + "\n" for i, t in zip(inputs, targets)))
    return str(path)


def _infer(model_dir, tmp, mode, inputs=INPUTS, targets=TARGETS):
    """infer of `model_dir` (its config.json) on the strings, in this process: its rows."""
    out = tmp / f"{mode}.jsonl"
    source = _jsonl(tmp / f"{mode}-in.jsonl", inputs, targets)
    launch_util.infer_in_process(model_dir, out, chunk_size=BATCH, mode=mode, input_file=source)
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.fixture(scope="module")
def t5(std):
    """The handle on the checkpointed T5 run (`from_run`: its config.json, latest step)."""
    model_dir = std.run(standard_runs.CHECKPOINTED)
    return model_dir, InteractiveModel.from_run(model_dir, batch_size=BATCH)


def test_t5_predict_and_score_equal_infer(t5, tmp_path):
    model_dir, model = t5
    assert model.step == standard_runs.CHECKPOINTED_STEPS and model.mesh["data"] == 8
    predicted = _infer(model_dir, tmp_path, "predict")
    preds = model.predict(INPUTS)
    assert preds == [r["prediction"] for r in predicted] and any(preds), preds
    scored = _infer(model_dir, tmp_path, "score")
    scores = model.score(INPUTS, TARGETS)
    np.testing.assert_allclose(scores, [r["score"] for r in scored], rtol=1e-6)
    assert all(s < 0 for s in scores)
    # predict_with_aux: the same strings, and the decoding's log-probability of each.
    again, aux = model.predict_with_aux(INPUTS)
    assert again == preds and len(aux["scores"]) == len(INPUTS) and all(s <= 0 for s in aux["scores"])
    assert [model.spec.vocabulary.decode(ids) for ids in aux["prediction_ids"]] == preds


def test_t5_evaluate_equals_the_runs_final_evaluation(std, t5):
    """`evaluate` (eval's code, the run's 8 examples in batches of 4) gives the perplexity the
    run's own final evaluation printed at the same step."""
    _, model = t5
    final = [
        line
        for line in std.log(standard_runs.CHECKPOINTED, stream="out").splitlines()
        if line.startswith(f"final evaluation at step {standard_runs.CHECKPOINTED_STEPS}")
    ]
    metrics = model.evaluate()["shakespeare_span_corruption"]
    assert final and f"perplexity {metrics['perplexity']:.4g}" in final[0], (final, metrics)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_decoder_only_trained_saved_and_read_by_infer(std, tmp_path, caplog):
    """A fresh decoder-only model (`from_config` of the LM experiment, no checkpoint) trained on
    strings and saved, then infer reads the saved run: the same sampled predictions (the config's
    `post_training` sampling) and scores as the handle's. (`from_run` is the T5 run's.) A prompt
    longer than `post_training.max_input_length` (the targets length, 64) keeps its last 64
    tokens, with one warning naming its row, and is decoded as those tokens are."""
    overrides = {
        "model_dir": str(tmp_path / "unused"),
        "data.cache_dir": str(std.cache),
        "optimizer.warmup_steps": 0,
        "post_training.max_decode_length": 6,
    }
    model = InteractiveModel.from_config(launch_util.LM_CONFIG, overrides=overrides, batch_size=BATCH)
    assert model.step == 0 and model.continues_prompt
    lines = ["To be, or not to be, that is the question:", "Whether 'tis nobler in the mind to suffer"]
    losses = [model.train_step(lines)["loss"] for _ in range(3)]
    assert losses[-1] < losses[0], losses
    (preds, aux), scores = model.predict_with_aux(INPUTS), model.score(INPUTS, TARGETS)
    assert all(0 < len(ids) <= 6 for ids in aux["prediction_ids"]), aux
    long = " ".join(lines * 30)
    with caplog.at_level(logging.WARNING, logger="cairn.launchers.prompt_limit"):
        cut = model.predict([INPUTS[0], long])
    warned = [r.getMessage() for r in caplog.records if r.name == "cairn.launchers.prompt_limit"]
    assert len(warned) == 1 and "row 1 (" in warned[0] and "last tokens" in warned[0], warned
    tail = model.spec.vocabulary.decode(model.spec.vocabulary.encode(long)[-64:])
    assert cut == [preds[0], model.predict([INPUTS[0], tail])[1]]
    run = model.save(tmp_path / "run")
    assert [r["prediction"] for r in _infer(run, tmp_path, "predict")] == preds
    np.testing.assert_allclose([r["score"] for r in _infer(run, tmp_path, "score")], scores, rtol=1e-6)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model_dir"] == run


def test_a_lora_handle_trains_only_its_adapters(std, t5):
    """LoRA over the checkpointed run (its base): zero-initialized adapters predict what the
    base predicts; `train_step` changes the adapters, never the base."""
    model_dir, base = t5
    overrides = {"model.lora.rank": 4, "init.checkpoint": str(model_dir), "optimizer.learning_rate": 0.1}
    model = InteractiveModel.from_config(str(model_dir / "config.json"), overrides=overrides, batch_size=BATCH)
    assert model.predict(INPUTS) == base.predict(INPUTS)
    names = ["/".join(str(k.key) for k in path) for path, _ in jax.tree_util.tree_leaves_with_path(model.state.params)]
    assert names and all(n.endswith(("lora_a", "lora_b")) for n in names), names
    frozen, adapters = _leaves(model.state.frozen), _leaves(model.state.params)
    examples = [{"inputs": i, "targets": t} for i, t in zip(INPUTS, TARGETS)]
    losses = [model.train_step(examples)["loss"] for _ in range(2)]
    assert losses[-1] < losses[0], losses
    assert all(np.array_equal(a, b) for a, b in zip(frozen, _leaves(model.state.frozen)))
    assert all(not np.array_equal(a, b) for a, b in zip(adapters, _leaves(model.state.params)) if not a.any())


def test_bad_input_is_a_clear_error(t5, tmp_path):
    model_dir, model = t5
    with pytest.raises(ValueError, match="inputs is empty"):
        model.predict([])
    with pytest.raises(TypeError, match="inputs must be a list of strings, got str"):
        model.predict("To be")
    with pytest.raises(TypeError, match=r"inputs\[1\] must be a string, got int"):
        model.predict(["To be", 3])
    with pytest.raises(ValueError, match="one target per input"):
        model.score(["a", "b"], ["c"])
    with pytest.raises(ValueError, match=r"targets\[1\] is empty"):
        model.score(["a", "b"], ["c", ""])
    with pytest.raises(TypeError, match=r"examples\[0\] must be \{'inputs': str, 'targets': str\}"):
        model.train_step([{"inputs": "a"}])
    with pytest.raises(ValueError, match="examples is empty"):
        model.train_step([])
    with pytest.raises(ConfigError, match="'checkpoint'.*does not exist"):
        InteractiveModel.from_config(str(model_dir / "config.json"), checkpoint=tmp_path / "missing")
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        InteractiveModel.from_config(str(model_dir / "config.json"), checkpoint=tmp_path)
    with pytest.raises(ConfigError, match="'model_dir'.*no config.json"):
        InteractiveModel.from_run(tmp_path)
    # infer's .jsonl --input_file in score mode needs a target in every row.
    with pytest.raises(ConfigError, match="'mode'.*--input_file row 1 has none"):
        _infer(model_dir, tmp_path, "score", ["a", "b"], ["c", ""])


def test_t5_train_step_lowers_the_loss_and_predict_sees_it(t5):
    """The same examples three times on the run's handle (last in this file: it trains the
    module's handle), which holds the run's optimizer state: the params change, the loss falls,
    and their score rises."""
    _, model = t5
    examples = [{"inputs": i, "targets": t} for i, t in zip(INPUTS, TARGETS)]
    # The run's optimizer state is restored with its params, not started afresh (t5x's handle).
    from cairn.trainer import restore_opt_state

    stored = restore_opt_state(model.checkpoint, model.trainer.abstract_state.opt_state)
    restored = _leaves(model.state.opt_state)
    assert [a.tolist() for a in restored] == [a.tolist() for a in _leaves(stored)]
    assert any(a.dtype.kind == "f" and np.any(a != 0) for a in restored)  # trained moments
    before, score_before = _leaves(model.state.params), model.score(INPUTS, TARGETS)
    losses = [model.train_step(examples)["loss"] for _ in range(3)]
    assert model.step == standard_runs.CHECKPOINTED_STEPS + 3 == int(model.state.step)
    assert losses[-1] < losses[0], losses
    assert any(not np.array_equal(a, b) for a, b in zip(before, _leaves(model.state.params)))
    assert sum(model.score(INPUTS, TARGETS)) > sum(score_before)
