"""Fine-tuning through the train entry point: from a Hugging Face T5 directory
(`init.hf_checkpoint`, via `import_hf`), then from that run's cairn checkpoint
(`init.checkpoint`, via `restore_params`); from a t5x checkpoint; a mixture of experts
upcycled from a dense cairn checkpoint (`init.upcycle_from`)."""

import json
import os

import launch_util
import numpy as np
import pytest

FINETUNE = str(launch_util.CONFIGS / "t5_1_1_finetune.py") + ":tiny"
SPM = str(launch_util.REPO / "launchers" / "data" / "shakespeare.model")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """`(env, cache_dir)`: two short plays and one task cache, shared by every run here (the
    same task and lengths)."""
    tmp = tmp_path_factory.mktemp("finetune_data")
    return {"CAIRN_SHAKESPEARE_DIR": launch_util.small_texts(tmp)}, tmp / "cache"


def first_loss(model_dir):
    rows = [json.loads(line) for line in open(os.path.join(model_dir, "summaries", "metrics.jsonl"))]
    return next(r["value"] for r in rows if r["metric"] == "loss" and r["step"] == 1)


def args(model_dir, cache_dir, *extra):
    return [
        f"--config={FINETUNE}",
        f"--config.model_dir={model_dir}",
        f"--config.data.cache_dir={cache_dir}",
        f"--config.vocabulary.path={SPM}",
        "--config.data.task_modules=('cairn.launchers.tasks.shakespeare',)",
        "--config.data.task=shakespeare_span_corruption",
        "--config.data.sequence_length.inputs=64",
        "--config.data.sequence_length.targets=16",
        "--config.data.batch_size=8",
        "--config.num_train_steps=2",
        "--config.trainer.eval_every=0",
        "--config.post_training.final_eval=false",
        "--config.post_training.num_samples=0",
        *extra,
    ]


def test_finetune_from_hugging_face_then_from_a_cairn_checkpoint(tmp_path, data):
    import jax

    from cairn.models import EncoderDecoderModel, export_hf, get_preset, import_hf

    config = get_preset("t5_1_1_tiny", vocab_size=2176)  # the Shakespeare vocabulary, rounded up
    params = EncoderDecoderModel(config).init(jax.random.PRNGKey(7))
    # Zero output kernel: uniform logits, so the first loss is known exactly if the import is used.
    params["decoder"]["logits"] = np.zeros_like(params["decoder"]["logits"])
    hf_dir = tmp_path / "hf"
    export_hf(params, config, str(hf_dir))
    env, cache = data
    uniform = np.log(2176) + 1e-4 * np.log(2176) ** 2  # cross-entropy + z-loss of uniform logits

    a, c = tmp_path / "a", tmp_path / "c"
    proc = launch_util.train(args(a, cache, f"--config.init.hf_checkpoint={hf_dir}"), env=env)
    assert proc.returncode == 0, launch_util.tail(proc)
    assert f"initial params from {hf_dir}" in proc.stdout and "trained to step 2" in proc.stdout
    assert abs(first_loss(a) - uniform) < 1e-3, first_loss(a)

    proc = launch_util.train(
        args(c, cache, f"--config.init.checkpoint={a}", "--config.init.checkpoint_step=2"), env=env
    )
    assert proc.returncode == 0, launch_util.tail(proc)
    assert f"initial params from {a}" in proc.stdout
    assert first_loss(c) < first_loss(a)  # two steps of training (on these batches) already in the params
    _, reloaded = import_hf(str(hf_dir))
    assert np.array_equal(reloaded["decoder"]["logits"], params["decoder"]["logits"])


def test_finetune_from_a_t5x_checkpoint(tmp_path, data):
    import jax

    from cairn.models import EncoderDecoderModel, get_preset
    from cairn.models.t5x_checkpoint import export_t5x

    config = get_preset("t5_1_1_tiny", vocab_size=2176)
    params = EncoderDecoderModel(config).init(jax.random.PRNGKey(7))
    params["decoder"]["logits"] = np.zeros_like(params["decoder"]["logits"])  # uniform logits: known loss
    export_t5x(params, str(tmp_path / "t5x" / "checkpoint_1000"), step=1000)
    env, cache = data
    a = tmp_path / "a"
    proc = launch_util.train(args(a, cache, f"--config.init.t5x_checkpoint={tmp_path / 't5x'}"), env=env)
    assert proc.returncode == 0, launch_util.tail(proc)
    assert f"initial params from {tmp_path / 't5x'}" in proc.stdout and "trained to step 2" in proc.stdout
    assert abs(first_loss(a) - (np.log(2176) + 1e-4 * np.log(2176) ** 2)) < 1e-3, first_loss(a)
    # Another preset than the checkpoint's: exit 2, one line naming the tensor.
    proc = launch_util.train(
        args(
            tmp_path / "b",
            cache,
            f"--config.init.t5x_checkpoint={tmp_path / 't5x'}",
            "--config.model.preset=t5_1_1_small",
        ),
        env=env,
    )
    assert proc.returncode == 2, launch_util.tail(proc)
    assert "'init.t5x_checkpoint'" in proc.stderr and "has shape" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_upcycle_a_dense_checkpoint_into_a_mixture_of_experts(tmp_path, data):
    import jax
    import orbax.checkpoint as ocp

    from cairn.launchers import config_base, validation
    from cairn.models import EncoderDecoderModel, get_preset

    config = config_base.base_config()
    config.vocabulary.kind = "byte"
    config.init.upcycle_from = str(tmp_path)
    with pytest.raises(validation.ConfigError, match=r"'init.upcycle_from': .*set model.overrides.moe"):
        validation.check_paths(config)

    params = EncoderDecoderModel(get_preset("t5_1_1_tiny", vocab_size=2176)).init(jax.random.PRNGKey(7))
    params["decoder"]["logits"] = np.zeros_like(params["decoder"]["logits"])  # uniform logits: known loss
    step_dir = tmp_path / "dense" / "checkpoints" / "5"
    with ocp.PyTreeCheckpointer() as ckptr:  # a cairn step folder: the train state under `state`
        ckptr.save(step_dir / "state", {"params": params, "step": np.int32(5)})
    env, cache = data
    a = tmp_path / "a"
    moe = "--config.model.overrides.moe={'num_experts': 4, 'every': 2, 'dropless': True}"
    proc = launch_util.train(args(a, cache, f"--config.init.upcycle_from={tmp_path / 'dense'}", moe), env=env)
    assert proc.returncode == 0, launch_util.tail(proc)
    assert f"initial params upcycled from {tmp_path / 'dense'}" in proc.stdout and "trained to step 2" in proc.stdout
    rows = [json.loads(line) for line in open(a / "summaries" / "metrics.jsonl")]
    step1 = {r["metric"]: r["value"] for r in rows if r["step"] == 1}
    # The upcycled model computes the dense one: uniform logits, plus the routers' auxiliary loss.
    uniform = np.log(2176) + 1e-4 * np.log(2176) ** 2
    assert abs(step1["loss"] - step1["moe/aux_loss"] - uniform) < 1e-3, step1
    # Experts wider than the dense MLP: exit 2, one line naming the tensor.
    wide = moe[:-1] + ", 'expert_mlp_dim': 64}"
    proc = launch_util.train(args(tmp_path / "b", cache, f"--config.init.upcycle_from={step_dir}", wide), env=env)
    assert proc.returncode == 2, launch_util.tail(proc)
    assert "'init.upcycle_from': decoder/layers_1/mlp/wi_0: the dense kernel" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
