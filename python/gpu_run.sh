#!/usr/bin/env bash
# The Python package on the GPU machine, from the GPU bundle (tools/gpu_bundle.sh puts this beside
# the wheel): the wheel built for the machine's Python and torch, installed into a fresh virtual
# environment and checked there by python/wheel/wheel_test.sh --cuda (every pytest suite,
# test_cuda.py and test_proofs_cuda.py included, a lockstep-launch job, every console command,
# lockstep-qualify --device=cuda). Leaves the environment at $LOCKSTEP_VENV (default
# /tmp/lockstep-venv) for the bundle's examples.
#   .gpu-bundle/python/gpu_run.sh
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 LOCKSTEP_PYTHON=${LOCKSTEP_PYTHON:-python3}
export DIGEST_REFERENCE=$here/wheel/digest_reference.py
export TEST_TMPDIR=${TEST_TMPDIR:-$(mktemp -d)} LOCKSTEP_VENV=${LOCKSTEP_VENV:-/tmp/lockstep-venv}
exec "$here/wheel/wheel_test.sh" "$here/wheel/lockstep.whl" "$here/wheel/wheel_name.txt" \
  "$here/tests" --cuda
