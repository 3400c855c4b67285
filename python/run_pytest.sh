#!/usr/bin/env bash
# Runs the pytest files named as arguments (python/tests/...) against the package that
# //python:package lays out, with Debian's Python and python3-torch (setup.sh installs them).
#   run_pytest.sh test_rng.py [pytest arguments...]        (a file of python/tests)
#   run_pytest.sh examples/lm/python/test_train.py [...]   (a path from the workspace root)
set -euo pipefail
root=${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-lockstep}}
cd "${root:-$(dirname "$0")/..}"
export PYTHONPATH=$PWD/python/pkg:$PWD/python/tests
file=$1
shift
[[ $file == */* ]] || file=python/tests/$file
# Skips are listed (-rs) and, under Bazel, written with every case to Bazel's test.xml
# ($XML_OUTPUT_FILE): a skipped case makes the test count as not run (docs/building.md).
exec "${LOCKSTEP_PYTHON:-/usr/bin/python3}" -m pytest -q -rs -p no:cacheprovider \
  ${XML_OUTPUT_FILE:+"--junitxml=$XML_OUTPUT_FILE"} "$file" "$@"
