"""`//launchers:jobset`: a Kubernetes JobSet manifest that trains an experiment on a GKE TPU
slice or a GPU node pool, one pod per host.

    bazel run //launchers:jobset -- --config=launchers/configs/EXP.py [--config.a.b=v ...] \\
        --image=IMAGE --accelerator=tpu-v5-lite-podslice --topology=4x4 --output=jobset.yaml
    bazel run //launchers:jobset -- --config=... --image=IMAGE --accelerator=nvidia-h100-80gb \\
        --num_hosts=2 [--gpus_per_host=8] --output=jobset.yaml

The config is checked first, as `train` checks it before touching a device (schema, model,
paths, the mesh against the slice's devices), and `model_dir` must be set (a bucket: the pods
share it, and a restarted JobSet resumes from it). Every pod runs the same train command with
the same `--config` and overrides; `CAIRN_PROCESS_ID` is the pod's Job completion index,
`CAIRN_COORDINATOR_ADDRESS` the DNS name of pod 0 behind the JobSet's headless service.
Exit status 0 written; 2 bad input (one line on stderr).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from absl import flags

from cairn.launchers import cli, config_io, entry, run_spec
from cairn.launchers.pod_layout import GPUS, TPUS, JobSetError, Layout, TpuKind, layout  # noqa: F401 (re-exported)
from cairn.launchers.run_spec import RunSpec
from cairn.launchers.validation import ConfigError
from cairn.launchers.yaml_text import to_yaml

API_VERSION = "jobset.x-k8s.io/v1alpha2"
REPLICATED_JOB = "workers"  # pod hostnames: <name>-workers-0-<index>.<name>
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"  # what $JOB_COMPLETION_INDEX is read from


@dataclasses.dataclass(frozen=True)
class PodOptions:
    """What the pods run and how the set restarts."""

    name: str
    image: str
    namespace: str = ""
    workdir: str = "/cairn"  # the repository root inside the image
    # the train entry point under `supervise`, which turns JAX's abort on a lost coordinator
    # (process 0's pod gone) into one line and exit 3
    train_command: tuple = ("python", "-m", "cairn.launchers.supervise", "python", "-m", "cairn.launchers.train_main")
    coordinator_port: int = 8476
    max_restarts: int = 10
    grace_period_s: int = 120


# PID 1 of every container. The trainer saves a checkpoint on SIGTERM and exits 0; on a pod that
# would mark the host's work as done, so a signalled run exits 143 instead: the Job fails and the
# JobSet restarts every pod (failurePolicy), and training resumes from model_dir. A SIGTERM that
# comes before `$child` is set is passed on just after; a wait cut short by the trap is repeated
# (127: the trainer's status was already collected).
WRAPPER = """\
n=0
child=
trap 'n=$((n + 1)); [ -z "$child" ] || kill -TERM "$child" 2>/dev/null' TERM
"$@" &
child=$!
[ "$n" = 0 ] || kill -TERM "$child" 2>/dev/null
status=
seen=-1
while [ "$seen" != "$n" ]; do
  seen=$n
  wait "$child"; code=$?
  if [ "$code" != 127 ] || [ -z "$status" ]; then status=$code; fi
done
if [ "$n" -gt 0 ] && [ "$status" = 0 ]; then
  echo "cairn: SIGTERM: checkpoint saved; exit 143 so that the JobSet restarts and resumes" >&2
  exit 143
fi
exit "$status"
""".rstrip("\n")


def pod_hostname(name: str, index: int) -> str:
    """The hostname JobSet gives pod `index` of the set `name` (its one Job)."""
    return f"{name}-{REPLICATED_JOB}-0-{index}"


def coordinator_address(options: PodOptions) -> str:
    """Pod 0 of the set, through the headless service (subdomain = the JobSet's name)."""
    return f"{pod_hostname(options.name, 0)}.{options.name}:{options.coordinator_port}"


def render(train_args: Sequence[str], lay: Layout, options: PodOptions, experiment: str = "") -> dict:
    """The JobSet as a dict: one replicated Job of `lay.hosts` indexed pods, each running
    `options.train_command + train_args`."""
    escaped = [a.replace("$", "$$") for a in (*options.train_command, *train_args)]  # no $(VAR) expansion
    env = [
        {
            "name": "CAIRN_PROCESS_ID",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}},
        },
        {"name": "CAIRN_NUM_PROCESSES", "value": str(lay.hosts)},
        {"name": "CAIRN_COORDINATOR_ADDRESS", "value": coordinator_address(options)},
    ]
    container: dict[str, Any] = {
        "name": "train",
        "image": options.image,
        "workingDir": options.workdir,
        "command": ["/bin/sh", "-c", WRAPPER, "cairn-train"],
        "args": escaped,
        "env": env,
        "ports": [{"name": "coordinator", "containerPort": options.coordinator_port}],
        "resources": {"limits": {lay.resource: lay.devices_per_host}},
    }
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": options.grace_period_s,
        "nodeSelector": lay.node_selector,
        "containers": [container],
    }
    if not lay.tpu:  # NCCL needs more shared memory than a container's default 64 MB
        container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
        pod["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    metadata: dict[str, Any] = {"name": options.name}
    if options.namespace:
        metadata["namespace"] = options.namespace
    metadata["labels"] = {"app.kubernetes.io/name": "cairn-train"}
    annotations = {"cairn/experiment": experiment} if experiment else {}
    if lay.tpu:  # one slice per Job: its pods on one node pool
        annotations["alpha.jobset.sigs.k8s.io/exclusive-topology"] = "cloud.google.com/gke-nodepool"
    if annotations:
        metadata["annotations"] = annotations
    job = {
        "parallelism": lay.hosts,
        "completions": lay.hosts,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": {"metadata": {"labels": {"app.kubernetes.io/name": "cairn-train"}}, "spec": pod},
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "metadata": metadata,
        "spec": {
            "failurePolicy": {"maxRestarts": options.max_restarts},
            "network": {"enableDNSHostnames": True, "subdomain": options.name, "publishNotReadyAddresses": True},
            "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1, "template": {"spec": job}}],
        },
    }


def default_name(experiment: str, hosts: int) -> str:
    """A DNS label from the experiment's name, short enough for the pods' hostnames."""
    name = re.sub(r"[^a-z0-9-]+", "-", (experiment or "cairn").lower()).strip("-") or "cairn"
    if not name[0].isalpha():
        name = "cairn-" + name
    room = 63 - len(pod_hostname("", hosts - 1))
    return name[:room].rstrip("-")


def check_name(name: str, hosts: int) -> None:
    """`JobSetError` unless `name` is a DNS label that keeps every pod hostname within 63 characters."""
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
        raise JobSetError(
            "name", f"{name!r} is not a DNS label (lowercase letters, digits and '-', starting with a letter)"
        )
    longest = pod_hostname(name, hosts - 1)
    if len(longest) > 63:
        raise JobSetError(
            "name", f"{name!r} is too long: the pod hostname {longest!r} has {len(longest)} characters (at most 63)"
        )


# --- the command line --------------------------------------------------------------------

IMAGE = flags.DEFINE_string("image", "", "container image with the repository at --workdir (required)")
ACCELERATOR = flags.DEFINE_string("accelerator", "", f"GKE accelerator: {', '.join(list(TPUS) + list(GPUS))}")
TOPOLOGY = flags.DEFINE_string("topology", "", "TPU slice topology, e.g. 4x4 or 2x2x4")
NUM_HOSTS = flags.DEFINE_integer("num_hosts", None, "hosts (pods); TPU: derived from the topology")
GPUS_PER_HOST = flags.DEFINE_integer("gpus_per_host", None, "GPUs per node (default: the node kind's most)")
OUTPUT = flags.DEFINE_string("output", "-", "the manifest to write ('-': stdout)")
NAME = flags.DEFINE_string("name", "", "JobSet name (default: from config.experiment)")
NAMESPACE = flags.DEFINE_string("namespace", "", "Kubernetes namespace (default: kubectl's)")
WORKDIR = flags.DEFINE_string("workdir", PodOptions.workdir, "the repository root inside the image")
TRAIN_COMMAND = flags.DEFINE_string(
    "train_command", shlex.join(PodOptions.train_command), "what runs the train entry point in the image"
)
PORT = flags.DEFINE_integer("coordinator_port", PodOptions.coordinator_port, "jax.distributed coordinator port")
MAX_RESTARTS = flags.DEFINE_integer(
    "max_restarts", PodOptions.max_restarts, "JobSet restarts (preemptions included) before it fails"
)
GRACE = flags.DEFINE_integer(
    "grace_period_s", PodOptions.grace_period_s, "seconds between SIGTERM and SIGKILL (the final checkpoint must fit)"
)

_RAW_ARGV: list = []


def repo_root() -> str:
    """Where repository paths start: the Bazel workspace under `bazel run`, else the user's directory."""
    return os.environ.get("BUILD_WORKSPACE_DIRECTORY") or config_io.user_dir()


def train_args(argv: Sequence[str], root: str | None = None) -> list:
    """The train entry point's flags from the renderer's command line, as every pod must see
    them: `--config=` with the file's path relative to the repository root, then each
    `--config.a.b=v` override as given."""
    root = os.path.abspath(root or repo_root())
    spec, overrides, i = None, [], 0
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if a == "--config" and nxt is not None:
            spec, i = nxt, i + 1
        elif a.startswith("--config="):
            spec = a[len("--config=") :]
        elif re.match(r"--(no)?config\.", a):
            if "=" not in a and a.startswith("--config.") and nxt is not None and not nxt.startswith("-"):
                a, i = f"{a}={nxt}", i + 1
            overrides.append(a)
        i += 1
    if not spec:
        raise ConfigError("config", "--config=path/to/experiment.py[:arg] is required (see launchers/configs/)")
    path, sep, arg = spec.partition(":")
    full = os.path.normpath(os.path.join(config_io.user_dir(), os.path.expanduser(path)))
    if os.path.exists(full):
        rel = os.path.relpath(full, root)
        if rel == ".." or rel.startswith(".." + os.sep):
            raise ConfigError(
                "config",
                f"{full} is outside the repository {root}: the pods see only the "
                f"repository (in the image); put the experiment file in it",
            )
        path = rel
    return [f"--config={path}{sep}{arg}", *overrides]


def build(argv: Sequence[str], spec: RunSpec, raw_config: Any) -> tuple:
    """Checks everything; returns `(manifest dict, layout, options)`. `spec` is the loaded
    config's `RunSpec`; `raw_config` the config as given (before default paths)."""
    if not IMAGE.value:
        raise JobSetError(
            "image", "required: a container image with the repository at --workdir (launchers/README.md, 'Kubernetes')"
        )
    lay = layout(ACCELERATOR.value, TOPOLOGY.value, NUM_HOSTS.value, GPUS_PER_HOST.value)
    for flag, value, least in (
        ("coordinator_port", PORT.value, 1),
        ("max_restarts", MAX_RESTARTS.value, 0),
        ("grace_period_s", GRACE.value, 0),
    ):
        if value < least:
            raise JobSetError(flag, f"{value}: must be >= {least}")
    name = NAME.value or default_name(raw_config.experiment, lay.hosts)
    check_name(name, lay.hosts)
    command = tuple(shlex.split(TRAIN_COMMAND.value))
    if not command:
        raise JobSetError("train_command", "empty")
    if not raw_config.model_dir:
        raise ConfigError(
            "model_dir",
            "empty: the pods need one model_dir they all reach and that outlives them "
            "(a restarted JobSet resumes from it), e.g. --config.model_dir=gs://BUCKET/EXP",
        )
    for key in ("coordinator_address", "num_processes", "process_id"):
        if raw_config.multihost[key] not in (None, ""):
            raise ConfigError(
                f"multihost.{key}",
                "set by the JobSet for every pod ($CAIRN_* from the pod's index); remove it from the config",
            )
    slices = raw_config.partitioning.get("num_slices", 1)
    if slices != 1:
        raise ConfigError(
            "partitioning.num_slices",
            f"{slices}: the manifest holds one slice (one Job of "
            f"--num_hosts pods); multi-slice JobSets are not written yet",
        )
    mesh = run_spec.resolve_mesh(spec, lay.devices, lay.hosts)  # `run_spec.bind`'s checks on the pods' devices
    parts = mesh["data"] * mesh["fsdp"] * mesh.get("expert", 1)  # the batch's devices; host shards divide them
    run_spec.check_train_batch_size(spec, parts, math.gcd(parts, lay.hosts), mesh, lay.hosts)
    options = PodOptions(
        name=name,
        image=IMAGE.value,
        namespace=NAMESPACE.value,
        workdir=WORKDIR.value,
        train_command=command,
        coordinator_port=PORT.value,
        max_restarts=MAX_RESTARTS.value,
        grace_period_s=GRACE.value,
    )
    return render(train_args(argv), lay, options, raw_config.experiment), lay, options


def _main(spec: RunSpec) -> None:
    raw = cli.CONFIG.value
    manifest, lay, options = build(_RAW_ARGV[1:], spec, raw)
    shown = [a for a in _RAW_ARGV[1:] if not a.startswith("--output")]
    header = (
        f"Rendered by //launchers:jobset from: {shlex.join(shown)}\n"
        f"{lay.hosts} host(s) x {lay.devices_per_host} {lay.accelerator}"
        f"{' (topology ' + lay.topology + ')' if lay.topology else ''}; kubectl apply -f this file"
    )
    text = to_yaml(manifest, header)
    notes = []
    if "://" not in raw.model_dir:
        notes.append(f"model_dir {raw.model_dir!r} is not a URL: every pod must mount it at that path")
    if lay.hosts > 1 and not raw.data.cache_dir:
        notes.append(
            "data.cache_dir is the default (in each pod's home): every host needs the task cache; "
            "set a shared one or cache it into the image"
        )
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    if OUTPUT.value == "-":
        sys.stdout.write(text)
    else:
        path = config_io.resolve_path(OUTPUT.value)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {path}: JobSet {options.name!r}, {lay.hosts} pod(s); coordinator {coordinator_address(options)}")


def _parse(argv: list) -> list:
    _RAW_ARGV[:] = list(argv)
    return cli.parse_flags(argv)


def run() -> None:
    """The program: a bad flag or config is one line, exit 2."""
    cli.run_entry_point(_main, expected=(JobSetError,), logs=lambda: None, flags_parser=_parse)


if __name__ == "__main__":
    entry.main(run)
