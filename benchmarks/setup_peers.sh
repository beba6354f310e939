#!/usr/bin/env bash
# Creates (or updates) the peer virtualenv used by benchmarks and parity checks:
# seqio and its TensorFlow stack, and Grain, kept out of .venv (docs/design.md §10).
#
#   bash benchmarks/setup_peers.sh        # idempotent; silent when already set up
#
# The venv lives at <repo>/.peer-venv (ignored by git and Bazel). A stamp file inside it
# holds the SHA-256 of the pinned list below and the interpreter version; when both match,
# the script exits at once without output. Change a pin and the next run reinstalls.
#
# Environment:
#   PEER_PYTHON  interpreter to build the venv with (default: python3.11)
#   PEER_VENV    venv location (default: <repo>/.peer-venv)
#   PEER_FORCE=1 reinstall even if the stamp matches
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${PEER_VENV:-$REPO_ROOT/.peer-venv}"
PYTHON="${PEER_PYTHON:-python3.11}"
STAMP="$VENV/.cairn-peers.stamp"

# Pinned peers. seqio 0.0.20 pulls jax, clu, pyglove and tensorflow-datasets; shared
# packages are pinned to the versions .venv uses where they work. protobuf is the exception:
# seqio imports sentencepiece_model_pb2, which sentencepiece 0.2.3 generated with protobuf
# 7.36.1, so the runtime must be >= 7.36.1 here (.venv keeps 6.33.6; cairn.tokenizers does
# not import that module). TensorFlow 2.21 accepts protobuf < 8, and
# googleapis-common-protos / tensorflow-metadata accept 7.x.
read -r -d '' PINS <<'EOF' || true
seqio==0.0.20
tensorflow==2.21.0
tensorflow-text==2.21.1
tensorflow-datasets==4.9.10
tensorflow-metadata==1.21.0
protobuf==7.36.2
googleapis-common-protos==1.76.0
numpy==2.4.6
jax==0.10.2
jaxlib==0.10.2
sentencepiece==0.2.3
clu==0.0.12
pyglove==0.4.5
editdistance==0.8.1
immutabledict==4.3.1
grain==0.2.18
EOF

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "setup_peers: $PYTHON not found; set PEER_PYTHON to a Python 3.11 interpreter" >&2
  exit 1
fi
PY_VERSION="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [[ "$PY_VERSION" != "3.11" ]]; then
  echo "setup_peers: $PYTHON is Python $PY_VERSION; the peers need 3.11" >&2
  exit 1
fi

WANT="$(printf '%s\npython=%s\n' "$PINS" "$PY_VERSION" | sha256sum | cut -d' ' -f1)"

# Fast path: already set up with exactly these pins.
if [[ "${PEER_FORCE:-0}" != 1 && -x "$VENV/bin/python" && -f "$STAMP" \
      && "$(cat "$STAMP")" == "$WANT" ]]; then
  exit 0
fi

# One installer at a time (two engineers running benchmarks at once).
mkdir -p "$VENV"
exec 9>"$VENV/.setup.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
  # Someone else may have finished the job while we waited.
  if [[ "${PEER_FORCE:-0}" != 1 && -x "$VENV/bin/python" && -f "$STAMP" \
        && "$(cat "$STAMP")" == "$WANT" ]]; then
    exit 0
  fi
fi

start=$SECONDS
# A venv built by another interpreter version is rebuilt from scratch.
if [[ -x "$VENV/bin/python" ]] \
   && [[ "$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" != "$PY_VERSION" ]]; then
  echo "setup_peers: $VENV is not Python $PY_VERSION; recreating it"
  "$PYTHON" -m venv --clear "$VENV"
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "setup_peers: creating $VENV with $("$PYTHON" --version)"
  "$PYTHON" -m venv "$VENV"
fi
rm -f "$STAMP"

echo "setup_peers: installing pinned peers (seqio, tensorflow, tensorflow-text ...)"
PIN_FILE="$(mktemp)"
trap 'rm -f "$PIN_FILE"' EXIT
printf '%s\n' "$PINS" >"$PIN_FILE"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$PIN_FILE"

# Smoke test before stamping: seqio, its tf-text ops and TensorFlow must all import.
"$VENV/bin/python" - <<'EOF'
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import seqio, tensorflow as tf, tensorflow_text, google.protobuf, grain
print(f"setup_peers: seqio {seqio.__version__}, tensorflow {tf.__version__}, "
      f"tensorflow-text {tensorflow_text.__version__}, protobuf {google.protobuf.__version__}, "
      f"grain {grain.__version__ if hasattr(grain, '__version__') else '0.2.x'}")
EOF

echo "$WANT" >"$STAMP"
echo "setup_peers: done in $((SECONDS - start)) s ($VENV)"
