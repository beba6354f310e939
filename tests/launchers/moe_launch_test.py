"""Mixture of experts through the launchers: the `model.moe.*` keys onto the network's `MoeConfig`
and `partitioning.mesh.expert` (bad values: `ConfigError` naming the key; one line, exit 2 from
the train entry point), a config saved before the keys existed resumes, shakespeare_moe_tiny
trained a few steps with expert parallelism (routing metrics in metrics.jsonl and on the
progress line), and moe_1b_pretrain through the JobSet renderer's dry run.

The train program's runs are processes forked from one interpreter that imported it (the
`programs` fixture), on 4 CPU devices (`launch_util.devices`): an expert axis of 4 needs no more,
and a training child compiles for 4 devices instead of 8."""

import json

import launch_util
import pytest
import yaml

from cairn.launchers import cli_help, config_io, resume_check, run_spec, validation
from cairn.launchers.validation import ConfigError

CONFIG = str(launch_util.CONFIGS / "shakespeare_moe_tiny.py")
MOE_1B = "launchers/configs/moe_1b_pretrain.py"

devices = launch_util.devices_fixture(4)


@pytest.fixture(scope="module")
def programs(devices):
    """The train program, forked (the module's `devices` in its environment): `programs.run(args, env)`."""
    with launch_util.ForkServer("cairn.launchers.train_main", preload=("cairn.models", "cairn.trainer")) as server:
        yield server


def _config(**keys):
    config = config_io.load_config_file(CONFIG)
    for key, value in keys.items():
        config_io.set_path(config, key.replace("__", "."), value)
    return config


def _net(**keys):
    return launch_util.spec(_config(**keys)).model


def test_moe_keys_build_the_networks_moe_config():
    moe = _net().moe
    assert (moe.num_experts, moe.top_k, moe.expert_mlp_dim, moe.capacity_factor) == (4, 2, 128, 1.25)
    assert (moe.routing, moe.jitter_noise, moe.load_balance_loss_weight) == ("token_choice", 0.01, 0.01)
    assert _net(model__moe__routing="expert_choice", model__moe__dropless=True).moe.capacity(64) == 64
    # num_experts 0: the preset's MLPs (dense), and then no other model.moe key may be set.
    config = _config()
    config.model.moe = validation.schema.base_config().model.moe
    assert launch_util.spec(config).model.moe is None
    lines = "\n".join(cli_help.key_lines())
    for key in ("num_experts", "top_k", "routing", "capacity_factor", "dropless", "every", "expert_mlp_dim"):
        assert f"--config.model.moe.{key} " in lines, key
    assert "--config.partitioning.mesh " in lines and "expert" in lines


@pytest.mark.parametrize(
    "keys,key,text",
    [
        ({"model__moe__top_k": 5}, "model.moe.top_k", r"moe.top_k \(5\) must be <= moe.num_experts \(4\)"),
        ({"model__moe__capacity_factor": 0.0}, "model.moe.capacity_factor", "must be a positive number, got 0.0"),
        ({"model__moe__capacity_factor": -0.5}, "model.moe.capacity_factor", "must be a positive number"),
        ({"model__moe__jitter_noise": 1.5}, "model.moe.jitter_noise", r"must be in \[0, 1\)"),
        ({"model__moe__num_experts": 0}, "model.moe.expert_mlp_dim", "has no effect: model.moe.num_experts is 0"),
        ({"model__moe__every": 2, "model__overrides__scan_layers": True}, "model.moe.every", "needs scan_layers=False"),
        ({"model__overrides__moe": {"num_experts": 2}}, "model.moe.num_experts", "contradicts model.overrides.moe"),
        ({"partitioning__mesh__expert": 3}, "model.moe.num_experts", "4 experts do not divide over .*expert=3"),
    ],
)
def test_bad_moe_values_name_their_key(keys, key, text):
    with pytest.raises(ConfigError, match=rf"config key '{key}': .*{text}"):
        _net(**keys)


def test_the_expert_axis_is_checked_once_resolved():
    spec = launch_util.spec(_config(partitioning__mesh={"data": 2, "expert": -1}))
    with pytest.raises(ConfigError, match=r"'model.moe.num_experts': 4 experts do not divide over .*expert=3"):
        run_spec.resolve_mesh(spec, device_count=6)
    assert run_spec.resolve_mesh(spec, device_count=8) == {"data": 2, "fsdp": 1, "expert": 4, "model": 1}
    # A size-1 expert axis is left out of the mesh (a dense run's mesh is what it was).
    assert run_spec.resolve_mesh(launch_util.spec(_config()), device_count=8) == {"data": 8, "fsdp": 1, "model": 1}


def test_a_config_saved_before_the_moe_keys_resumes(tmp_path):
    config = _config(model_dir=str(tmp_path), model__moe=validation.schema.base_config().model.moe)
    old = config_io.stored_form(config)
    del old["model"]["moe"], old["partitioning"]["mesh"]["expert"]  # written before they existed
    (tmp_path / "config.json").write_text(json.dumps(old))
    resume_check.check(config_io.stored_form(config), config_io.to_plain(config), allowed=[])  # the same run
    config.model.moe.num_experts = 4
    config.model.moe.expert_mlp_dim = 128
    with pytest.raises(ConfigError, match=r"model.moe.expert_mlp_dim: \(absent\) -> 128.*model.moe.num_experts"):
        resume_check.check(config_io.stored_form(config), config_io.to_plain(config), allowed=[])


def test_a_bad_moe_key_from_the_command_line_is_one_line_exit_2(programs, tmp_path):
    proc = programs.run(
        [f"--config={CONFIG}", f"--config.model_dir={tmp_path / 'run'}", "--config.model.moe.top_k=5"], timeout=180
    )
    assert proc.returncode == 2, launch_util.tail(proc)
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists(), launch_util.tail(proc)
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: config key 'model.moe.top_k': moe.top_k (5) must be <= moe.num_experts (4)"), line


def test_a_short_expert_parallel_run_logs_the_routing_metrics(programs, devices, tmp_path):
    env = {"CAIRN_SHAKESPEARE_DIR": launch_util.small_texts(tmp_path)}
    args = [
        f"--config={CONFIG}",
        f"--config.model_dir={tmp_path / 'run'}",
        f"--config.data.cache_dir={tmp_path / 'cache'}",
        "--config.num_train_steps=3",
        "--config.data.batch_size=8",
        "--config.trainer.log_every=1",
        "--config.partitioning.mesh.expert=4",  # 4 devices: one expert each (data 1 x expert 4)
        "--config.post_training.final_eval=False",
        "--config.post_training.prompts=()",
    ]
    proc = programs.run(args, env=env, timeout=300)
    assert proc.returncode == 0, launch_util.tail(proc)
    assert (
        devices == 4
        and json.loads((tmp_path / "run" / "fingerprint" / "header.json").read_text())["mesh"]["expert"] == 4
    )
    rows = [json.loads(line) for line in open(tmp_path / "run" / "summaries" / "metrics.jsonl")]
    train = {(r["step"], r["metric"]): r["value"] for r in rows if r["task"] == "train"}
    for step in (1, 2, 3):
        for name in ("moe/load_balance_loss", "moe/router_z_loss", "moe/dropped_fraction", "moe/aux_loss"):
            assert (step, name) in train, (step, name)
        assert 0 <= train[step, "moe/dropped_fraction"] < 1
        # A mean over the 2 routed layers: near 2 (top-2 routing, nearly uniform at the start),
        # where a sum over the layers would be near 4.
        assert 1.5 < train[step, "moe/load_balance_loss"] < 3
        weighted = 0.01 * train[step, "moe/load_balance_loss"] + 0.001 * train[step, "moe/router_z_loss"]
        assert train[step, "moe/aux_loss"] == pytest.approx(weighted, rel=1e-5)
    assert "moe balance" in proc.stderr and "dropped" in proc.stderr  # the progress line
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["model"]["moe"]["num_experts"] == 4 and saved["partitioning"]["mesh"]["expert"] == 4
    assert list((tmp_path / "run" / "tensorboard" / "train").glob("events.out.tfevents.*"))


def test_moe_1b_pretrain_passes_the_jobset_dry_run(tmp_path):
    config = config_io.resolve_paths(config_io.load_config_file(str(launch_util.REPO / MOE_1B)))
    net = validation.check_model(launch_util.typed(config))
    moe = net.moe
    assert (moe.num_experts, moe.top_k, moe.expert_mlp_dim) == (8, 2, 4096)
    mesh = validation.resolve_mesh(config.partitioning.mesh, device_count=256)
    validation.check_expert_axis(mesh, net)
    assert mesh == {"data": 8, "fsdp": 4, "expert": 8, "model": 1}
    out = tmp_path / "jobset.yaml"
    args = [
        f"--config={MOE_1B}",
        "--config.model_dir=gs://bucket/runs/moe",
        "--image=registry.example/cairn:1",
        "--accelerator=tpu-v5-lite-podslice",
        "--topology=8x8",
        f"--output={out}",
        f"--config.vocabulary.path={launch_util.tiny_tokenizer_json(tmp_path / 'tokenizer.json')}",
    ]
    env = {"BUILD_WORKSPACE_DIRECTORY": "", "BUILD_WORKING_DIRECTORY": ""}
    proc = launch_util.run("cairn.launchers.jobset", args, env=env, timeout=240)
    assert proc.returncode == 0, launch_util.tail(proc)
    job = yaml.safe_load(out.read_text())["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["parallelism"] == 16 and f"--config={MOE_1B}" in job["template"]["spec"]["containers"][0]["args"]
