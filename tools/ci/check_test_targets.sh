#!/usr/bin/env bash
# Every tests/**/*_test.py is a Bazel test target, or one per library, `<name>_<lib>`
# (cairn_per_library_test): a test file without one never runs in CI.
# Prints the files without a target and exits 1 when there is one. Needs ./bazelw.
set -uo pipefail
cd "$(dirname "$0")/../.."
targets=$(./bazelw query 'tests(//tests/...)' --output=label 2>/dev/null | sed -E 's#^//##; s#:#/#')
if [ -z "$targets" ]; then
  echo "bazel query 'tests(//tests/...)' listed no targets"
  exit 1
fi
rc=0
for f in $(git ls-files 'tests/*_test.py'); do
  if ! grep -qxE "${f%.py}(_(storage|tokenizers|datatasks|partitioning|models|evaluation|trainer|launchers))?" <<<"$targets"; then
    echo "no Bazel test target for $f (add it to $(dirname "$f")/BUILD)"
    rc=1
  fi
done
exit $rc
