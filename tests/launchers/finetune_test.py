"""Fine-tuning through the train entry point: from a Hugging Face T5 directory
(`init.hf_checkpoint`, via `import_hf`), then from that run's cairn checkpoint
(`init.checkpoint`, via `restore_params`); from a t5x checkpoint; a mixture of experts
upcycled from a dense cairn checkpoint (`init.upcycle_from`). Each run is a process forked from
one interpreter that imported the train program (the `runs` fixture), on 2 CPU devices
(`launch_util.devices`): initialising from a checkpoint needs no mesh of 8, and a training
child on 2 devices costs about half the CPU of one on 8."""

import json
import os

import launch_util
import numpy as np
import pytest

devices = launch_util.devices_fixture(2)

FINETUNE = str(launch_util.CONFIGS / "t5_1_1_finetune.py") + ":tiny"
SPM = str(launch_util.REPO / "launchers" / "data" / "shakespeare.model")


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


UNIFORM = np.log(2176) + 1e-4 * np.log(2176) ** 2  # cross-entropy + z-loss of uniform logits


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every fine-tuning run here, in order, each in its own process forked from one interpreter
    that imported the train program (`launch_util.run_forked`: its own exit status, stdout and
    stderr): `{name: (process, model_dir)}`. They start from one tiny T5.1.1 (the Shakespeare
    vocabulary, rounded up) with a zero output kernel (uniform logits: the first loss is known
    exactly if the import is used), written here as a Hugging Face directory, a t5x checkpoint
    and a cairn step folder; all read the standard runs' two short plays and their task cache
    (`launch_util.standard_data`: caching, and the TensorFlow import it takes, is not what is
    tested here)."""
    import jax
    import orbax.checkpoint as ocp

    from cairn.models import EncoderDecoderModel, export_hf, get_preset
    from cairn.models.t5x_checkpoint import export_t5x

    tmp = tmp_path_factory.mktemp("finetune")
    texts, cache = launch_util.standard_data(tmp)  # the task is cached already: no run caches it
    env = {"CAIRN_SHAKESPEARE_DIR": texts}
    params = EncoderDecoderModel(get_preset("t5_1_1_tiny", vocab_size=2176)).init(jax.random.PRNGKey(7))
    params["decoder"]["logits"] = np.zeros_like(params["decoder"]["logits"])
    hf_dir, t5x_dir, dense = tmp / "hf", tmp / "t5x", tmp / "dense"
    export_hf(params, get_preset("t5_1_1_tiny", vocab_size=2176), str(hf_dir))
    export_t5x(params, str(t5x_dir / "checkpoint_1000"), step=1000)
    step_dir = dense / "checkpoints" / "5"
    with ocp.PyTreeCheckpointer() as ckptr:  # a cairn step folder: the train state under `state`
        ckptr.save(step_dir / "state", {"params": params, "step": np.int32(5)})
    moe = "--config.model.overrides.moe={'num_experts': 4, 'every': 2, 'dropless': True}"
    wide = moe[:-1] + ", 'expert_mlp_dim': 64}"  # experts wider than the dense MLP
    names = ("hf", "from_hf_run", "t5x", "t5x_other_preset", "upcycled", "upcycled_wide")
    dirs = {name: tmp / f"{name}_run" for name in names}
    plan = {
        "hf": (f"--config.init.hf_checkpoint={hf_dir}",),
        "from_hf_run": (f"--config.init.checkpoint={dirs['hf']}", "--config.init.checkpoint_step=2"),
        "t5x": (f"--config.init.t5x_checkpoint={t5x_dir}",),
        "t5x_other_preset": (f"--config.init.t5x_checkpoint={t5x_dir}", "--config.model.preset=t5_1_1_small"),
        "upcycled": (f"--config.init.upcycle_from={dense}", moe),
        "upcycled_wide": (f"--config.init.upcycle_from={step_dir}", wide),
    }
    procs = launch_util.run_forked(
        "cairn.launchers.train_main",
        [args(dirs[name], cache, *extra) for name, extra in plan.items()],
        env=env,
        timeout=600,
        preload=("cairn.models", "cairn.trainer"),
    )
    return {
        "params": params,
        "hf_dir": hf_dir,
        "t5x_dir": t5x_dir,
        "dense": dense,
        **{name: (proc, dirs[name]) for name, proc in zip(plan, procs, strict=True)},
    }


def test_finetune_from_hugging_face_then_from_a_cairn_checkpoint(runs):
    from cairn.models import import_hf

    hf_dir = runs["hf_dir"]
    proc, a = runs["hf"]
    assert proc.returncode == 0, launch_util.tail(proc)
    assert f"initial params from {hf_dir}" in proc.stdout and "trained to step 2" in proc.stdout
    assert "caching task" not in proc.stdout  # the standard runs' cache of the same task
    assert abs(first_loss(a) - UNIFORM) < 1e-3, first_loss(a)

    proc, c = runs["from_hf_run"]  # init.checkpoint = the run above, step 2
    assert proc.returncode == 0, launch_util.tail(proc)
    assert f"initial params from {a}" in proc.stdout
    assert first_loss(c) < first_loss(a)  # two steps of training (on these batches) already in the params
    _, reloaded = import_hf(str(hf_dir))
    assert np.array_equal(reloaded["decoder"]["logits"], runs["params"]["decoder"]["logits"])


def test_finetune_from_a_t5x_checkpoint(runs):
    t5x_dir = runs["t5x_dir"]
    proc, a = runs["t5x"]
    assert proc.returncode == 0, launch_util.tail(proc)
    assert f"initial params from {t5x_dir}" in proc.stdout and "trained to step 2" in proc.stdout
    assert abs(first_loss(a) - UNIFORM) < 1e-3, first_loss(a)
    # Another preset than the checkpoint's: exit 2, one line naming the tensor.
    proc, _ = runs["t5x_other_preset"]
    assert proc.returncode == 2, launch_util.tail(proc)
    assert "'init.t5x_checkpoint'" in proc.stderr and "has shape" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_upcycle_a_dense_checkpoint_into_a_mixture_of_experts(runs, tmp_path):
    from cairn.launchers import config_base, run_spec, validation

    config = config_base.base_config()
    config.vocabulary.kind = "byte"
    config.init.upcycle_from = str(tmp_path)
    with pytest.raises(validation.ConfigError, match=r"'init.upcycle_from': .*set model.overrides.moe"):
        validation.check_paths(run_spec.checked_keys(config)[1])

    dense = runs["dense"]
    proc, a = runs["upcycled"]
    assert proc.returncode == 0, launch_util.tail(proc)
    assert f"initial params upcycled from {dense}" in proc.stdout and "trained to step 2" in proc.stdout
    rows = [json.loads(line) for line in open(a / "summaries" / "metrics.jsonl")]
    step1 = {r["metric"]: r["value"] for r in rows if r["step"] == 1}
    # The upcycled model computes the dense one: uniform logits, plus the routers' auxiliary loss.
    assert abs(step1["loss"] - step1["moe/aux_loss"] - UNIFORM) < 1e-3, step1
    # Experts wider than the dense MLP: exit 2, one line naming the tensor.
    proc, _ = runs["upcycled_wide"]
    assert proc.returncode == 2, launch_util.tail(proc)
    assert "'init.upcycle_from': decoder/layers_1/mlp/wi_0: the dense kernel" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
