#!/usr/bin/env bash
# Every tests/**/*_test.py is a source of a Bazel test target: its own (`cairn_py_test`), one
# per library (`cairn_per_library_test`) or a group's (`cairn_py_test_group`, several modules in
# one process). A test file in no target never runs in CI.
# Prints the files without a target and exits 1 when there is one. Needs ./bazelw.
set -uo pipefail
cd "$(dirname "$0")/../.."
sources=$(./bazelw query 'labels(srcs, tests(//tests/...))' --output=label 2>/dev/null | sed -E 's#^//##; s#:#/#')
if [ -z "$sources" ]; then
  echo "bazel query 'labels(srcs, tests(//tests/...))' listed no sources"
  exit 1
fi
rc=0
for f in $(git ls-files 'tests/*_test.py'); do
  if ! grep -qxF "$f" <<<"$sources"; then
    echo "no Bazel test target for $f (add it to $(dirname "$f")/BUILD)"
    rc=1
  fi
done
exit $rc
