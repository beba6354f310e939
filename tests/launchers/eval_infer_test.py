"""`//launchers:eval` and `//launchers:infer` on a short run of the default experiment (two
short plays): evaluating one checkpoint and watching a run's checkpoints, skipping those
already evaluated (in this process: `eval_main.evaluate`), a run without checkpoints refused by
the entry point (a child process: exit 2, one line); predictions in chunks, resumed, and never
mixed. Infer runs in this process on the run's saved config (`launch_util.infer_in_process`):
its files and its refusal to mix are the point (its process's exit status is decode_test's).
The eval entry point's successful runs as processes are eval_infer_multiprocess_test's. The run
is the standard runs' checkpointed one (tests/fixtures/standard_runs.py, trained once per
build); the LM twin continuing prompts is decode_test's (its trained LM twin)."""

import json
import os
from unittest import mock

import launch_util
import pytest
import standard_runs

from cairn.launchers.validation import ConfigError


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The standard 6-step run with checkpoints at 2, 4 and 6 (`standard_runs.CHECKPOINTED`,
    unpacked with its checkpoints), evaluated after training on 8 examples in batches of 4."""
    std = standard_runs.unpack(tmp_path_factory.mktemp("evalinfer"), checkpoints=True)
    env = {"CAIRN_SHAKESPEARE_DIR": std.texts}
    model_dir = std.run(standard_runs.CHECKPOINTED)
    common = [
        f"--config={launch_util.T5_CONFIG}",
        f"--config.model_dir={model_dir}",
        f"--config.data.cache_dir={std.cache}",
        "--config.num_train_steps=6",
        "--config.data.batch_size=8",
        "--config.eval.num_examples=8",
        "--config.eval.batch_size=4",
    ]
    assert json.loads((model_dir / "config.json").read_text())["num_train_steps"] == 6
    out = std.log(standard_runs.CHECKPOINTED, stream="out")
    final = [line for line in out.splitlines() if line.startswith("final evaluation at step 6")]
    return model_dir, common, env, final


def eval_rows(path):
    return [json.loads(line) for line in open(path)]


@pytest.fixture(scope="module")
def evals(run, tmp_path_factory):
    """`--step=4`, then `--watch`, evaluated in this process (`eval_main.evaluate`, what the
    program runs once its flags are parsed, on the run's saved config with the overrides of
    `common`; this process builds the same pipeline for infer), then the eval entry point as a
    child process with `--checkpoint=<an empty folder>` (its exit status and one line; it fails
    before importing TensorFlow). Returns `(the lines --step=4 printed, those --watch printed, the
    process, the empty folder)`."""
    from cairn.launchers import config_io, eval_main

    model_dir, common, env, _ = run
    with mock.patch.dict(os.environ, env):
        config = config_io.resolve_paths(config_io.load_saved_config(str(model_dir / "config.json")))
        config.model_dir = str(model_dir)
        config.data.cache_dir = next(a for a in common if a.startswith("--config.data.cache_dir=")).partition("=")[2]
        assert (config.num_train_steps, config.data.batch_size) == (6, 8)
        assert (config.eval.num_examples, config.eval.batch_size) == (8, 4)
        step4, watch = [], []
        assert list(eval_main.evaluate(launch_util.spec(config), str(model_dir), 4, out=step4.append)) == [4], step4
        done = eval_main.evaluate(
            launch_util.spec(config), str(model_dir), watch=True, poll_seconds=0.2, out=watch.append
        )
        assert list(done) == [2, 6], watch
    empty = tmp_path_factory.mktemp("empty")
    proc = launch_util.run("cairn.launchers.eval_main", common + [f"--checkpoint={empty}"], env=env)
    return "\n".join(step4), "\n".join(watch), proc, empty


def test_eval_one_checkpoint_and_watch(run, evals):
    model_dir, _, _, final = run
    step4, watch, _, _ = evals
    assert "step 4: shakespeare_span_corruption: nll_per_token" in step4
    assert "step 2:" not in step4 and "step 6:" not in step4
    log = model_dir / "eval" / "validation" / "evaluated.jsonl"
    # --watch (run after --step=4 wrote its row) evaluates the others (2 and 6; 4 is skipped)
    # and stops at the final step.
    assert [r["step"] for r in eval_rows(log)] == [4, 2, 6]
    assert "step 4:" not in watch and "evaluated the final step 6" in watch
    # The same numbers as the train entry point's own final evaluation.
    six = eval_rows(log)[-1]["metrics"]["shakespeare_span_corruption"]
    assert final and f"perplexity {six['perplexity']:.4g}" in final[0], (final, six)
    assert any(
        f.startswith("events.") for _, _, fs in os.walk(model_dir / "eval" / "validation" / "tensorboard") for f in fs
    )


def test_eval_without_checkpoints_is_a_clear_error(evals):
    _, _, proc, empty = evals
    assert proc.returncode == 2, launch_util.tail(proc)
    assert "no complete checkpoint" in proc.stderr and str(empty) in proc.stderr


def test_infer_writes_chunks_resumes_and_refuses_to_mix(run, tmp_path):
    model_dir, common, env, _ = run
    out = tmp_path / "preds.jsonl"
    launch_util.infer_in_process(model_dir, out, env, chunk_size=3, num_examples=8)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(8))
    assert all({"input", "target", "prediction", "prediction_ids"} <= set(r) for r in rows)
    assert all("<extra_id_0>" in r["input"] for r in rows)
    parts = sorted(p for p in os.listdir(f"{out}.parts") if p.startswith("part-"))
    assert parts == ["part-00000.jsonl", "part-00001.jsonl", "part-00002.jsonl"]
    # A lost chunk is recomputed (the same predictions); the others are reused.
    first = out.read_text()
    os.remove(f"{out}.parts/part-00001.jsonl")
    out.unlink()
    printed = launch_util.infer_in_process(model_dir, out, env, chunk_size=3, num_examples=8)
    assert "1 chunks computed, 2 resumed" in printed[-1]
    assert out.read_text() == first
    # Other predictions (another checkpoint step) into the same parts: refused with a
    # ConfigError naming the step, nothing lost. (The entry point turns infer's ConfigError into
    # one line and exit 2: decode_test's unknown mode, in a child process.)
    with pytest.raises(ConfigError, match="holds parts of other predictions") as refused:
        launch_util.infer_in_process(model_dir, out, env, chunk_size=3, num_examples=8, step=4)
    assert "step" in str(refused.value)
    assert out.read_text() == first
