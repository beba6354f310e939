"""//launchers:jobset: the JobSet manifest rendered from an experiment's config, parsed back."""

import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time

import launch_util
import pytest
import yaml

from cairn.launchers import jobset, yaml_text
from cairn.launchers.validation import ConfigError

CONFIG = "launchers/configs/shakespeare_t5_tiny.py"
POD_DIR = launch_util.REPO / "launchers" / "pod"
EXAMPLES = sorted(POD_DIR.glob("jobset_*.yaml"))
BASE = [f"--config={CONFIG}", "--config.model_dir=gs://bucket/runs/tiny", "--image=registry.example/cairn:1"]


ENV = {"BUILD_WORKSPACE_DIRECTORY": "", "BUILD_WORKING_DIRECTORY": ""}


def _render(args, **kwargs):
    """`python -m cairn.launchers.jobset <args>`: a child process, as a user runs it."""
    return launch_util.run("cairn.launchers.jobset", args, env=ENV, timeout=240, **kwargs)


def _render_many(argvs):
    """The renderer on each of `argvs`: each run in its own process, forked from one interpreter
    that imported the renderer (`launch_util.run_forked`: the same program, exit status, stdout
    and stderr, without importing it again for every run)."""
    return launch_util.run_forked(
        "cairn.launchers.jobset", argvs, env=ENV, timeout=240, preload=("cairn.models", "cairn.trainer")
    )


def _container(manifest):
    return _pod(manifest)["containers"][0]


def _pod(manifest):
    return manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def _env(manifest):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _container(manifest)["env"]}


def test_tpu_layouts():
    assert jobset.layout("tpu-v5-lite-podslice", "4x4") == jobset.Layout("tpu-v5-lite-podslice", 4, 4, "4x4")
    assert jobset.layout("tpu-v5-lite-podslice", "2x4").hosts == 1  # a single host of 8 chips
    assert jobset.layout("tpu-v6e-slice", "8x16", num_hosts=32).devices == 128
    v4 = jobset.layout("tpu-v4-podslice", "2x2x4")
    assert (v4.hosts, v4.devices_per_host) == (4, 4)
    assert jobset.layout("tpu-v5p-slice", "2x2x1").hosts == 1
    for args, flag, words in (
        (("tpu-v5-lite-podslice", "3x3"), "topology", "multiple of 4"),
        (("tpu-v4-podslice", "4x4"), "topology", "2x2x2"),
        (("tpu-v5-lite-podslice", ""), "topology", "not a topology"),
        (("tpu-v5-lite-podslice", "4x4", 2), "num_hosts", "4 host(s) of 4 chips"),
        (("tpu-v5-lite-podslice", "4x4", None, 8), "gpus_per_host", "GPU node pools"),
    ):
        with pytest.raises(jobset.JobSetError, match=r"^--" + flag) as e:
            jobset.layout(*args)
        assert words in str(e.value)


def test_gpu_layouts():
    assert jobset.layout("nvidia-h100-80gb", num_hosts=2) == jobset.Layout("nvidia-h100-80gb", 2, 8)
    assert jobset.layout("nvidia-l4", num_hosts=3, gpus_per_host=4).devices == 12
    with pytest.raises(jobset.JobSetError, match="--gpus_per_host: 3: a nvidia-h100-80gb node has 1, 2, 4, 8 GPUs"):
        jobset.layout("nvidia-h100-80gb", gpus_per_host=3)
    with pytest.raises(jobset.JobSetError, match="--topology: is for TPU slices"):
        jobset.layout("nvidia-h100-80gb", "2x4")
    with pytest.raises(jobset.JobSetError, match="did you mean 'nvidia-h100-80gb'"):
        jobset.layout("nvidia-h100-80g")


def test_yaml_round_trip_of_awkward_values():
    """The manifest's emitter (`yaml_text`): what PyYAML reads back is what was written."""
    value = {
        "plain": "gs://b/x",
        "words": [
            "true",
            "No",
            "null",
            "~",
            "8",
            "2x4",
            "1e3",
            "-1",
            "-.inf",
            "0x1f",
            "",
            " lead",
            "trail ",
            "a: b",
            "key:",
            "#c",
            "-c",
            "--config.a=b:c",
            "$(HOME)",
            "é",
            "tab\there",
            'quote"s',
            "back\\slash",
        ],
        "nums": [0, -3, 10**12],
        "flags": [True, False],
        "empty": {},
        "none": [],
        "block": "line 1\n  indented\n\nafter a blank",
        "ends_nl": "x\ny\n",
        "nested": [{"a": [{"b": 1, "c": ["d"]}], "e": "f"}, [1, [2]]],
        "weird key: x": 1,
    }
    assert yaml.safe_load(yaml_text.to_yaml(value, header="a comment\nsecond line")) == value
    assert "|-" in yaml_text.to_yaml({"s": jobset.WRAPPER})  # the script stays readable


def test_train_args_carry_config_and_overrides(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "exp").mkdir(parents=True)
    (repo / "exp" / "e.py").write_text("")
    monkeypatch.chdir(repo / "exp")
    monkeypatch.delenv("BUILD_WORKING_DIRECTORY", raising=False)
    args = jobset.train_args(
        [
            "--config",
            "e.py:small",
            "--image=x",
            "--config.a.b",
            "3",
            "--config.c=d e",
            "--noconfig.flag",
            "--output=o.yaml",
        ],
        root=str(repo),
    )
    assert args == ["--config=exp/e.py:small", "--config.a.b=3", "--config.c=d e", "--noconfig.flag"]
    # A path not found here is left for the runfiles tree (as train does); outside the repository: refused.
    assert jobset.train_args([f"--config={CONFIG}"], root=str(repo)) == [f"--config={CONFIG}"]
    (tmp_path / "outside.py").write_text("")
    with pytest.raises(ConfigError, match="outside the repository"):
        jobset.train_args([f"--config={tmp_path / 'outside.py'}"], root=str(repo))


@pytest.mark.parametrize("exit_after_term, save_s, want", [(0, 0.0, 143), (0, 1.0, 143), (1, 0.0, 1), (1, 1.0, 1)])
def test_wrapper_turns_a_saved_preemption_into_a_failure(exit_after_term, save_s, want):
    """The pods' PID 1: SIGTERM -> the trainer saves and exits 0 -> the pod exits 143 (restart);
    any other status after SIGTERM passes through."""
    child = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (time.sleep({save_s}), print('saved', flush=True), "
        f"sys.exit({exit_after_term})))\n"
        "print('ready', flush=True)\ntime.sleep(60)"
    )
    proc = subprocess.Popen(
        ["sh", "-c", jobset.WRAPPER, "cairn-train", sys.executable, "-c", child],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        # As on a pod, the signal comes once the wrapper waits for the trainer: dash can miss a
        # trapped signal that lands in the instant before its `wait` blocks (seen once under CI
        # load here; the residual race is noted in launchers/README.md).
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "saved" in out
    assert proc.returncode == want, err
    for code in (0, 3):  # no signal: the trainer's exit status
        done = subprocess.run(
            ["sh", "-c", jobset.WRAPPER, "x", sys.executable, "-c", f"raise SystemExit({code})"], timeout=60
        )
        assert done.returncode == code


def test_tpu_manifest(tmp_path):
    out = tmp_path / "jobset.yaml"
    config = str(launch_util.REPO / CONFIG)  # an absolute path becomes repository-relative
    result = _render(
        [
            f"--config={config}",
            "--config.model_dir=gs://bucket/runs/tiny",
            "--config.seed",
            "7",
            "--config.experiment=tiny$(x)",
            "--image=registry.example/cairn:1",
            "--accelerator=tpu-v5-lite-podslice",
            "--topology=4x4",
            "--max_restarts=5",
            f"--output={out}",
        ]
    )
    assert result.returncode == 0, launch_util.tail(result)
    m = yaml.safe_load(out.read_text())
    assert (m["apiVersion"], m["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    name = m["metadata"]["name"]
    assert name == "tiny-x"
    assert (
        m["metadata"]["annotations"]["alpha.jobset.sigs.k8s.io/exclusive-topology"] == "cloud.google.com/gke-nodepool"
    )
    assert m["spec"]["failurePolicy"] == {"maxRestarts": 5}
    assert m["spec"]["network"]["enableDNSHostnames"] is True
    rjob = m["spec"]["replicatedJobs"][0]
    job = rjob["template"]["spec"]
    assert (rjob["replicas"], job["parallelism"], job["completions"], job["backoffLimit"]) == (1, 4, 4, 0)
    assert job["completionMode"] == "Indexed"
    pod, container = _pod(m), _container(m)
    assert pod["restartPolicy"] == "Never"
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "4x4",
    }
    assert container["resources"]["limits"] == {"google.com/tpu": 4}
    assert container["image"] == "registry.example/cairn:1"
    assert container["command"][:2] == ["/bin/sh", "-c"]
    assert container["args"] == [
        "python",
        "-m",
        "cairn.launchers.supervise",  # a lost coordinator: one line, exit 3
        "python",
        "-m",
        "cairn.launchers.train_main",
        f"--config={CONFIG}",
        "--config.model_dir=gs://bucket/runs/tiny",
        "--config.seed=7",
        "--config.experiment=tiny$$(x)",
    ]  # $$: no Kubernetes variable expansion
    env = _env(m)
    assert env["CAIRN_PROCESS_ID"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    assert env["CAIRN_NUM_PROCESSES"] == "4"
    subdomain = m["spec"]["network"]["subdomain"]
    assert env["CAIRN_COORDINATOR_ADDRESS"] == f"{name}-{rjob['name']}-0-0.{subdomain}:8476"
    assert "volumes" not in pod


GPU_ARGS = BASE + [
    "--accelerator=nvidia-h100-80gb",
    "--num_hosts=2",
    "--config.data.batch_size=64",
    "--name=gpu-run",
    "--namespace=ml",
]


def test_gpu_manifest_on_stdout(forked):
    result = forked["gpu"]
    assert result.returncode == 0, launch_util.tail(result)
    m = yaml.safe_load(result.stdout)
    assert m["metadata"]["name"] == "gpu-run" and m["metadata"]["namespace"] == "ml"
    assert (
        "annotations" not in m["metadata"]
        or "alpha.jobset.sigs.k8s.io/exclusive-topology" not in m["metadata"]["annotations"]
    )
    job = m["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert (job["parallelism"], job["completions"]) == (2, 2)
    pod, container = _pod(m), _container(m)
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert container["args"][6:] == [
        f"--config={CONFIG}",
        "--config.model_dir=gs://bucket/runs/tiny",
        "--config.data.batch_size=64",
    ]
    assert _env(m)["CAIRN_NUM_PROCESSES"] == "2"
    assert _env(m)["CAIRN_COORDINATOR_ADDRESS"] == "gpu-run-workers-0-0.gpu-run:8476"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]


BAD = [
    (["--accelerator=tpu-v5-lite", "--topology=4x4"], "--accelerator: unknown accelerator 'tpu-v5-lite'"),
    (["--accelerator=tpu-v5-lite-podslice", "--topology=4x4", "--num_hosts=3"], "--num_hosts: 3 does not match"),
    (["--accelerator=tpu-v5-lite-podslice", "--topology=3x5"], "--topology: 3x5 (15 chips)"),
    (["--accelerator=nvidia-h200-141gb", "--gpus_per_host=4"], "--gpus_per_host: 4: a nvidia-h200-141gb node has 8"),
    (["--accelerator=nvidia-h100-80gb", "--config.partitioning.mesh.model=3"], "'partitioning.mesh'"),
    (
        ["--accelerator=nvidia-h100-80gb", "--config.multihost.process_id=1"],
        "'multihost.process_id': set by the JobSet",
    ),
    (["--accelerator=nvidia-h100-80gb", "--name=Bad_Name"], "--name: 'Bad_Name' is not a DNS label"),
    (["--accelerator=nvidia-l4", "--num_hosts=5"], "'data.batch_size': 32 does not divide over the 40"),
    (
        ["--accelerator=tpu-v5-lite-podslice", "--topology=4x4", "--config.partitioning.num_slices=2"],
        "'partitioning.num_slices': 2: the manifest holds one slice",
    ),
]


BAD_CASES = BAD + [("missing image", "--image: required"), ("missing model_dir", "'model_dir': empty")]


def _bad_args(extra):
    if extra == "missing image":
        return [a for a in BASE if not a.startswith("--image")] + ["--accelerator=nvidia-l4"]
    if extra == "missing model_dir":
        return [a for a in BASE if "model_dir" not in a] + ["--accelerator=nvidia-l4"]
    return BASE + extra


@pytest.fixture(scope="module")
def forked(tmp_path_factory):
    """Every run of the renderer below but test_tpu_manifest's, in one `_render_many`: the GPU
    manifest ("gpu"), each committed example's command line (its name), each bad input (its
    index in BAD_CASES, with the --output it was given)."""
    tmp = tmp_path_factory.mktemp("jobset")
    runs = {"gpu": GPU_ARGS}
    for example in EXAMPLES:
        first = example.read_text().splitlines()[0]
        assert first.startswith("# Rendered by //launchers:jobset from: ")
        runs[example.name] = shlex.split(first.split(" from: ", 1)[1])
    for i, (extra, _) in enumerate(BAD_CASES):
        runs[i] = _bad_args(extra) + [f"--output={tmp / f'bad{i}.yaml'}"]
    results = dict(zip(runs, _render_many(list(runs.values()))))
    results["tmp"] = tmp
    return results


@pytest.mark.parametrize("extra, message", BAD_CASES)
def test_bad_input_exits_2_with_one_line(forked, extra, message):
    i = next(i for i, case in enumerate(BAD_CASES) if case == (extra, message))
    result = forked[i]
    assert result.returncode == 2, launch_util.tail(result)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert not (forked["tmp"] / f"bad{i}.yaml").exists()


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_committed_examples_are_what_the_renderer_writes(forked, example):
    """launchers/pod/jobset_*.yaml: rerendered from the flags in their first line, byte for byte
    (after a change to the renderer: rerun that command with --output=<the file>)."""
    text = example.read_text()
    result = forked[example.name]
    assert result.returncode == 0, launch_util.tail(result)
    assert result.stdout == text
    m = yaml.safe_load(text)
    assert m["kind"] == "JobSet" and _container(m)["args"][6] == f"--config={CONFIG}"


def test_examples_exist():
    assert {p.name for p in EXAMPLES} >= {"jobset_tpu_v5e_4x4.yaml", "jobset_gpu_h100_2x8.yaml"}
    assert pathlib.Path(launch_util.REPO / CONFIG).exists()
