#!/usr/bin/env bash
# tools/lint.sh: ruff (lint and format) and mypy over the libraries, as CI runs them.
# `tools/lint.sh --fix` applies ruff's fixes and formatting first. Needs .venv (./bazelw makes it).
set -uo pipefail
cd "$(dirname "$0")/.."
venv=.venv/bin
if [ "${1:-}" = "--fix" ]; then
  "$venv/ruff" check --fix . && "$venv/ruff" format .
fi
rc=0
echo "-- ruff check";        "$venv/ruff" check . || rc=1
echo "-- ruff format --check"; "$venv/ruff" format --check . || rc=1
echo "-- mypy";              "$venv/mypy" $(git ls-files '*/cairn/*.py') || rc=1
exit $rc
