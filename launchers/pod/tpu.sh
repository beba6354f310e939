#!/usr/bin/env bash
# Train on a Cloud TPU VM or pod slice: create the TPU VM (or reuse it), copy this repository to
# every worker, set it up, and run //launchers:train on all workers at once. On a TPU VM,
# jax.distributed.initialize() finds the coordinator and the process ids by itself.
#
# usage (from the repository root):
#   launchers/pod/tpu.sh --name=NAME --zone=ZONE --accelerator_type=v4-32 \
#       --config=launchers/configs/EXPERIMENT.py [--version=tpu-ubuntu2204-base] [--project=P] \
#       [--remote_dir=cairn] [--setup_command=CMD | --skip_setup] [--plan] [--dry_run] [-- --config.x.y=v ...]
#
# --plan first plans the train step's memory for the slice here, before any TPU is created:
# XLA:TPU compiles the step for the described chips (train --dry_run --topology=ACCELERATOR_TYPE,
# libtpu, no TPU needed), and a step that does not fit stops the script (exit 2, one line).
# --dry_run prints every command it would run, one per line prefixed with "+ ", and runs none
# (gcloud is not needed). Arguments after "--" (and any --config.* argument) go to the trainer.
set -euo pipefail

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "tpu.sh: $*" >&2; exit 2; }

name="" zone="" accelerator_type="" version="tpu-ubuntu2204-base" config="" project="" setup_command=""
dry_run=0 skip_setup=0 plan=0 remote_dir="cairn"
overrides=()
while [[ $# -gt 0 ]]; do
  arg="$1"
  case "$arg" in
    --) shift; overrides+=("$@"); break ;;
    --dry_run) dry_run=1 ;;
    --plan) plan=1 ;;
    --skip_setup) skip_setup=1 ;;
    -h|--help) usage; exit 0 ;;
    --config.*) overrides+=("$arg") ;;
    --name=*|--zone=*|--accelerator_type=*|--version=*|--config=*|--project=*|--remote_dir=*|--setup_command=*)
      key="${arg%%=*}"; key="${key#--}"; printf -v "$key" '%s' "${arg#*=}" ;;
    --name|--zone|--accelerator_type|--version|--config|--project|--remote_dir|--setup_command)
      [[ $# -ge 2 ]] || die "$arg needs a value"
      key="${arg#--}"; printf -v "$key" '%s' "$2"; shift ;;
    *) die "unknown argument: $arg (see --help)" ;;
  esac
  shift
done
[[ -n "$name" ]] || die "--name is required (the TPU VM's name)"
[[ -n "$zone" ]] || die "--zone is required (e.g. us-central2-b)"
[[ -n "$accelerator_type" ]] || die "--accelerator_type is required (e.g. v4-8, v4-32, v5litepod-16)"
[[ -n "$config" ]] || die "--config is required (e.g. launchers/configs/EXPERIMENT.py)"
config_file="${config%%:*}"
if [[ $dry_run == 0 && ! -f "$config_file" ]]; then
  die "config file $config_file not found (paths are relative to the repository root: run from there)"
fi

gcloud_tpu=(gcloud compute tpus tpu-vm)
where=(--zone="$zone")
[[ -n "$project" ]] && where+=(--project="$project")

# Shell-quotes words (single quotes only where needed), for the remote command and the echo.
sq() {
  if [[ $1 =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
quote() { local out="" a; for a in "$@"; do out+=" $(sq "$a")"; done; printf '%s' "${out# }"; }
# Prints a command, prefixed with "+ "; runs it unless --dry_run.
run() {
  echo "+ $(quote "$@")"
  if [[ $dry_run == 0 ]]; then "$@"; fi
}

# 0. The plan (--plan): the step compiled here for the slice; a step that does not fit ends the
#    script here (set -e), before anything is created or paid for.
if [[ $plan == 1 ]]; then
  run ./bazelw run //launchers:train -- --config="$config" "${overrides[@]}" --dry_run --topology="$accelerator_type"
fi

# 1. The TPU VM: reuse it when it exists, else create it.
if [[ $dry_run == 1 ]]; then
  run "${gcloud_tpu[@]}" describe "$name" "${where[@]}"
  echo "# (create only if describe fails)"
  run "${gcloud_tpu[@]}" create "$name" "${where[@]}" --accelerator-type="$accelerator_type" --version="$version"
elif "${gcloud_tpu[@]}" describe "$name" "${where[@]}" >/dev/null 2>&1; then
  echo "tpu.sh: reusing TPU VM $name in $zone" >&2
else
  run "${gcloud_tpu[@]}" create "$name" "${where[@]}" --accelerator-type="$accelerator_type" --version="$version"
fi

# 2. The code: a tarball of the tracked and untracked-but-not-ignored files, to every worker.
archive="/tmp/cairn-src-$name.tar.gz"
echo "+ git ls-files -co --exclude-standard -z | tar --null -T - -czf $(quote "$archive")"
if [[ $dry_run == 0 ]]; then
  git ls-files -co --exclude-standard -z | tar --null -T - -czf "$archive"
fi
run "${gcloud_tpu[@]}" scp "$archive" "$name:cairn-src.tar.gz" "${where[@]}" --worker=all
run "${gcloud_tpu[@]}" ssh "$name" "${where[@]}" --worker=all \
  --command="mkdir -p $(quote "$remote_dir") && tar -xzf cairn-src.tar.gz -C $(quote "$remote_dir")"

# 3. Setup: Bazel and a JDK from apt (bazelw needs root for them), the venv, and libtpu for jax
#    (requirements.lock pins the CPU jax; jax[tpu] of the same version adds libtpu).
if [[ $skip_setup == 0 ]]; then
  setup="sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq"
  setup+=" bazel-bootstrap bazel-rules-java default-jdk-headless python3.11-venv"
  setup+=" && cd $(quote "$remote_dir") && ./bazelw build //launchers:train"
  setup+=" && .venv/bin/python -m pip install -q \"jax[tpu]==\$(.venv/bin/python -c 'import jax; print(jax.__version__)')\""
  setup+=" -f https://storage.googleapis.com/jax-releases/libtpu_releases.html"
  [[ -n "$setup_command" ]] && setup="cd $(quote "$remote_dir") && $setup_command"
  run "${gcloud_tpu[@]}" ssh "$name" "${where[@]}" --worker=all --command="$setup"
fi

# 4. Train on every worker, under //launchers:supervise (a lost worker 0, the coordinator, is one
#    line and exit 3 on the others instead of JAX's abort with a C++ stack).
train_args=(--config="$config" "${overrides[@]}")
command_line="cd $(quote "$remote_dir") && ./bazelw build //launchers:train //launchers:supervise"
command_line+=" && bazel-bin/launchers/supervise bazel-bin/launchers/train $(quote "${train_args[@]}")"
run "${gcloud_tpu[@]}" ssh "$name" "${where[@]}" --worker=all --command="$command_line"
