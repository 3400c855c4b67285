#!/usr/bin/env bash
# On a machine with two or more GPUs (the device's nvidia-h200-x2 and larger kinds): runs
# lockstep's hand-back benchmark (rng_nccl_benchmark from the GPU bundle) and the PyTorch
# baseline (torch_handback_baseline.py under torchrun, the machine's own torch) in one call, over
# all GPUs, and prints lockstep's median, the baseline's and their ratio against the targets
# (<= 20 us, <= 0.25 x the baseline). Exits 1 if either run fails or cannot measure.
#   tools/bench/handback.sh [ITERATIONS]      (from the repository root, after tools/gpu_bundle.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
iterations=${1:-2000}
bundle=.gpu-bundle
[[ -x $bundle/bin/rng_nccl_benchmark ]] || { echo "handback: no $bundle/bin/rng_nccl_benchmark (run tools/gpu_bundle.sh)"; exit 1; }
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
[[ $gpus -ge 2 ]] || { echo "handback: needs at least 2 GPUs; this machine has $gpus"; exit 1; }

# The bundle's library path, as run.sh sets it.
site=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
libs=$PWD/$bundle/lib:$site/torch/lib:/usr/local/cuda/lib64
for d in "$site"/nvidia/*/lib; do libs=$libs:$d; done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

ours=$(LD_LIBRARY_PATH=$libs "$bundle/bin/rng_nccl_benchmark" --iterations="$iterations" 2>&1)
rc=$?
echo "$ours"
[[ $rc == 0 ]] || { echo "handback: rng_nccl_benchmark failed (exit $rc)"; exit 1; }
theirs=$(python3 -m torch.distributed.run --standalone --nproc_per_node="$gpus" \
  tools/bench/torch_handback_baseline.py --iterations="$iterations" 2>&1)
rc=$?
echo "$theirs"
[[ $rc == 0 ]] || { echo "handback: the PyTorch baseline failed (exit $rc)"; exit 1; }

lockstep_us=$(sed -n 's/^HANDBACK_US=//p' <<<"$ours")
nccl_us=$(sed -n 's/^HANDBACK_NCCL_US=//p' <<<"$ours")
torch_us=$(sed -n 's/^TORCH_HANDBACK_US=//p' <<<"$theirs")
[[ -n $lockstep_us && -n $nccl_us && -n $torch_us ]] || { echo "handback: a median is missing"; exit 1; }
python3 - "$lockstep_us" "$nccl_us" "$torch_us" "$gpus" <<'PY'
import sys
ours, nccl, theirs, gpus = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
ratio = ours / theirs
print(f"hand-back on {gpus} GPUs: lockstep {ours:.1f} us (host lane), PyTorch baseline "
      f"{theirs:.1f} us, ratio {ratio:.3f}")
print(f"target <= 20 us: {'met' if ours <= 20 else 'NOT met'}; "
      f"target <= 0.25 x baseline: {'met' if ratio <= 0.25 else 'NOT met'}")
print(f"with the host lane off (bytes through NCCL): lockstep {nccl:.1f} us, ratio "
      f"{nccl / theirs:.3f}")
PY
