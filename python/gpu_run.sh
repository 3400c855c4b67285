#!/usr/bin/env bash
# The Python package's pytest suites on the GPU machine, from the GPU bundle
# (tools/gpu_bundle.sh puts this beside the package): the machine's Python and torch, the
# bundle's libraries (Abseil, glog, ...) on LD_LIBRARY_PATH, every suite (the CPU ones against
# torch 2.11, and test_cuda.py on the GPU). Prints pytest's summary per file.
#   .gpu-bundle/python/gpu_run.sh [pytest arguments...]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
site=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
libs=$here/../lib:$site/torch/lib:/usr/local/cuda/lib64
for d in "$site"/nvidia/*/lib; do libs=$libs:$d; done
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$here/pkg:$here/tests NCCL_NVLS_ENABLE=0
cd "$here"
python3 -m pytest -q -rs -p no:cacheprovider tests "$@"
