"""`//launchers:eval` and `//launchers:infer` on a short run of the default experiment (child
processes, two short plays): evaluating one checkpoint and watching a run's checkpoints,
skipping those already evaluated; predictions in chunks, resumed, and never mixed; the LM twin
continuing prompts. Infers whose files are the point run in this process on the run's saved
config (`launch_util.infer_in_process`); the refusal to mix runs the entry point as a child."""

import json
import os

import launch_util
import pytest


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 6-step run with checkpoints at 2, 4 and 6."""
    tmp = tmp_path_factory.mktemp("evalinfer")
    env = {"CAIRN_SHAKESPEARE_DIR": launch_util.small_texts(tmp)}
    model_dir = tmp / "run"
    common = [
        f"--config={launch_util.T5_CONFIG}",
        f"--config.model_dir={model_dir}",
        f"--config.data.cache_dir={tmp / 'cache'}",
        "--config.num_train_steps=6",
        "--config.data.batch_size=8",
        "--config.eval.num_examples=8",
        "--config.eval.batch_size=4",
    ]
    proc = launch_util.train(
        common
        + [
            "--config.trainer.checkpoint_every=2",
            "--config.trainer.keep_checkpoints=0",
            "--config.post_training.num_samples=0",
        ],
        env=env,
    )
    assert proc.returncode == 0, launch_util.tail(proc)
    final = [line for line in proc.stdout.splitlines() if line.startswith("final evaluation at step 6")]
    return model_dir, common, env, final


def eval_rows(path):
    return [json.loads(line) for line in open(path)]


def test_eval_one_checkpoint_and_watch(run):
    model_dir, common, env, final = run
    proc = launch_util.run("cairn.launchers.eval_main", common + ["--step=4"], env=env)
    assert proc.returncode == 0, launch_util.tail(proc)
    assert "step 4: shakespeare_span_corruption: nll_per_token" in proc.stdout
    log = model_dir / "eval" / "validation" / "evaluated.jsonl"
    assert [r["step"] for r in eval_rows(log)] == [4]
    # --watch evaluates the others (2 and 6; 4 is skipped) and stops at the final step.
    proc = launch_util.run("cairn.launchers.eval_main", common + ["--watch", "--poll_seconds=0.2"], env=env)
    assert proc.returncode == 0, launch_util.tail(proc)
    assert [r["step"] for r in eval_rows(log)] == [4, 2, 6]
    assert "step 4:" not in proc.stdout and "evaluated the final step 6" in proc.stdout
    # The same numbers as the train entry point's own final evaluation.
    six = eval_rows(log)[-1]["metrics"]["shakespeare_span_corruption"]
    assert final and f"perplexity {six['perplexity']:.4g}" in final[0], (final, six)
    assert any(
        f.startswith("events.") for _, _, fs in os.walk(model_dir / "eval" / "validation" / "tensorboard") for f in fs
    )


def test_eval_without_checkpoints_is_a_clear_error(run, tmp_path):
    _, common, env, _ = run
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = launch_util.run("cairn.launchers.eval_main", common + [f"--checkpoint={empty}"], env=env)
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
    # Other predictions (another checkpoint step) into the same parts: refused (the entry point
    # in a child process: exit 2), nothing lost.
    args = [f"--config={model_dir / 'config.json'}", f"--output={out}", "--chunk_size=3", "--num_examples=8"]
    proc = launch_util.run("cairn.launchers.infer_main", args + ["--step=4"], env=env)
    assert proc.returncode == 2, launch_util.tail(proc)
    assert "holds parts of other predictions" in proc.stderr and "step" in proc.stderr
    assert out.read_text() == first


def test_infer_of_the_lm_twin_continues_prompts(tmp_path):
    """A decoder-only model (the family's `continues_prompt`): `--input_file`'s lines, else the
    first half of each evaluation example, continued; the prediction excludes the prompt."""
    env = {"CAIRN_SHAKESPEARE_DIR": launch_util.small_texts(tmp_path)}
    common = [
        f"--config={launch_util.LM_CONFIG}",
        f"--config.model_dir={tmp_path / 'lm'}",
        f"--config.data.cache_dir={tmp_path / 'cache'}",
        "--config.num_train_steps=2",
        "--config.data.batch_size=8",
        "--config.eval.num_examples=4",
        "--config.post_training.max_decode_length=6",
    ]
    proc = launch_util.train(common + ["--config.post_training.final_eval=false"], env=env)
    assert proc.returncode == 0, launch_util.tail(proc)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("ROMEO. O, she\n\nTo be, or not\n")
    out = tmp_path / "file.jsonl"
    launch_util.infer_in_process(tmp_path / "lm", out, env, chunk_size=8, input_file=str(prompts))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["index"], r["input"], r["target"]) for r in rows] == [(0, "ROMEO. O, she", ""), (1, "To be, or not", "")]
    # At most max_decode_length (6) new tokens after each prompt, whatever its length.
    assert all(all(isinstance(t, int) for t in r["prediction_ids"]) for r in rows), rows
    assert all(len(r["prediction_ids"]) <= 6 for r in rows), rows
    out = tmp_path / "eval.jsonl"
    launch_util.infer_in_process(tmp_path / "lm", out, env, chunk_size=8)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(4))
    assert all(r["input"] and r["target"] and isinstance(r["prediction_ids"], list) for r in rows), rows
