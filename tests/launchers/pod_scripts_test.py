"""launchers/pod/tpu.sh and slurm.sbatch with --dry_run: the right commands, and none executed."""

import os
import pathlib
import shlex
import stat
import subprocess

import pytest

ROOT = pathlib.Path(__file__).absolute().parent.parent.parent
TPU, SLURM = ROOT / "launchers" / "pod" / "tpu.sh", ROOT / "launchers" / "pod" / "slurm.sbatch"
CONFIG = "launchers/configs/shakespeare_t5_tiny.py:small"


@pytest.fixture
def fake_path(tmp_path):
    """A PATH whose gcloud, scontrol, srun and git only leave a marker file (and fail)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "executed"
    for name in ("gcloud", "scontrol", "srun", "tar"):
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho {name} "$@" >> {marker}\nexit 1\n')
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}", marker


def _run(script, args, env_path, extra_env=None, cwd=None):
    env = {"PATH": env_path, "HOME": os.environ.get("HOME", "/tmp"), **(extra_env or {})}
    return subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, env=env, timeout=60, cwd=cwd or ROOT
    )


def _commands(stdout):
    return [line[2:] for line in stdout.splitlines() if line.startswith("+ ")]


def test_tpu_dry_run_prints_every_command_and_runs_none(fake_path, tmp_path):
    path, marker = fake_path
    result = _run(
        TPU,
        [
            "--name=pod-1",
            "--zone=us-central2-b",
            "--accelerator_type=v4-32",
            f"--config={CONFIG}",
            "--dry_run",
            "--",
            "--config.train.num_train_steps=100",
            "--config.name=it's mine",
        ],
        path,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    commands = _commands(result.stdout)
    assert not marker.exists(), marker.read_text()
    assert commands[0].startswith("gcloud compute tpus tpu-vm describe pod-1 --zone=us-central2-b")
    create = next(c for c in commands if " tpu-vm create " in c)
    assert "--accelerator-type=v4-32" in create and "--version=tpu-ubuntu2204-base" in create
    assert any(" tpu-vm scp " in c and "--worker=all" in c for c in commands)
    train = commands[-1]
    assert train.startswith("gcloud compute tpus tpu-vm ssh pod-1 --zone=us-central2-b --worker=all")
    remote = shlex.split(train)[-1]
    build = "./bazelw build //launchers:train //launchers:supervise"
    under = "bazel-bin/launchers/supervise bazel-bin/launchers/train "  # a lost worker 0: one line, exit 3
    assert remote.startswith(f"--command=cd cairn && {build} && {under}")
    trainer_args = shlex.split(remote.split(under, 1)[1])
    assert trainer_args == [f"--config={CONFIG}", "--config.train.num_train_steps=100", "--config.name=it's mine"]


def test_tpu_plan_comes_first_for_the_accelerator_type(fake_path):
    """--plan: the step planned here for the slice (`train --dry_run --topology=ACCELERATOR_TYPE`)
    before the TPU VM is looked up or created."""
    path, marker = fake_path
    args = ["--name=p", "--zone=z", "--accelerator_type=v5litepod-16", f"--config={CONFIG}", "--plan", "--dry_run"]
    result = _run(TPU, [*args, "--", "--config.data.batch_size=64"], path)
    assert result.returncode == 0, result.stderr
    commands = _commands(result.stdout)
    assert shlex.split(commands[0]) == [
        "./bazelw",
        "run",
        "//launchers:train",
        "--",
        f"--config={CONFIG}",
        "--config.data.batch_size=64",
        "--dry_run",
        "--topology=v5litepod-16",
    ]
    assert " tpu-vm describe " in commands[1] and not marker.exists()


def test_tpu_skip_setup_and_missing_flags(fake_path):
    path, marker = fake_path
    base = ["--name=p", "--zone=z", "--accelerator_type=v5litepod-16", f"--config={CONFIG}", "--dry_run"]
    result = _run(TPU, base + ["--skip_setup", "--project=proj"], path)
    assert result.returncode == 0, result.stderr
    commands = _commands(result.stdout)
    assert not any("apt-get" in c for c in commands) and all("--project=proj" in c for c in commands if "gcloud" in c)
    result = _run(TPU, ["--zone=z", "--dry_run", f"--config={CONFIG}"], path)
    assert result.returncode == 2 and "--name is required" in result.stderr
    result = _run(TPU, base + ["--bogus"], path)
    assert result.returncode == 2 and "unknown argument: --bogus" in result.stderr
    assert not marker.exists()


@pytest.mark.parametrize(
    "nodelist,host", [("node[01-02]", "node01"), ("gpu7", "gpu7"), ("a100-[3,5-6]", "a100-3"), ("hostb,hosta", "hostb")]
)
def test_slurm_dry_run_derives_the_coordinator(fake_path, nodelist, host):
    path, marker = fake_path
    env = {"SLURM_JOB_NODELIST": nodelist, "SLURM_NTASKS": "2", "DRY_RUN": "1"}
    result = _run(SLURM, [f"--config={CONFIG}", "--", "--config.seed=3"], path, env)
    assert result.returncode == 0, result.stderr
    assert not marker.exists(), marker.read_text()
    assert f"export CAIRN_COORDINATOR_ADDRESS={host}:12345" in result.stdout.splitlines()
    assert "export CAIRN_NUM_PROCESSES=2" in result.stdout.splitlines()
    srun = shlex.split(_commands(result.stdout)[-1])
    assert srun[0] == "srun" and "--ntasks=2" in srun and "--ntasks-per-node=1" in srun
    assert srun[-2:] == [f"--config={CONFIG}", "--config.seed=3"]
    assert srun[-4:-2] == ["bazel-bin/launchers/supervise", "bazel-bin/launchers/train"]


def test_slurm_flag_dry_run_override_nodelist_and_errors(fake_path):
    path, marker = fake_path
    env = {
        "SLURM_JOB_NODELIST": "ignored[1-2]",
        "CAIRN_NODELIST_OVERRIDE": "n[10-11]",
        "SLURM_NTASKS": "4",
        "CAIRN_COORDINATOR_PORT": "7000",
        "CAIRN_TRAIN_BINARY": "/opt/train",
    }
    result = _run(SLURM, ["--dry_run", "--config", CONFIG], path, env)
    assert result.returncode == 0, result.stderr
    assert "export CAIRN_COORDINATOR_ADDRESS=n10:7000" in result.stdout
    commands = _commands(result.stdout)
    assert len(commands) == 1 and "/opt/train --config=" in commands[0]  # a given binary: no build step
    result = _run(SLURM, ["--dry_run", f"--config={CONFIG}"], path, {"SLURM_NTASKS": "2"})
    assert result.returncode == 2 and "SLURM_JOB_NODELIST is not set" in result.stderr
    assert not marker.exists()


def test_scripts_have_strict_mode_and_sbatch_header():
    for script in (TPU, SLURM):
        text = script.read_text()
        assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    text = SLURM.read_text()
    for directive in ("--nodes=", "--ntasks-per-node=1", "--gpus-per-node="):
        assert f"#SBATCH {directive}" in text
