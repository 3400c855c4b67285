#!/usr/bin/env bash
# Builds lockstep's GPU tests and benchmarks against the LibTorch 2.11 + CUDA 13 SDK
# (../shared/gpu-sdk) with --config=cuda, and packs them into .gpu-bundle/ for the H200:
#   tools/gpu_bundle.sh            then, on the device:  ./.gpu-bundle/run.sh
#   tools/gpu_bundle.sh //trainer:trainer_benchmark ...   builds and packs only those targets
#                                  (no Python package, no example), for a quick measurement;
#                                  with BUNDLE_PYTHON=1, the Python package and examples too.
# The CPU tests of rng/collectives/base/checkpoint/tools are included too, so the 2.11 build of
# the CPU paths runs there as well.
set -euo pipefail
cd "$(dirname "$0")/.."
sdk_script=${GPU_SDK:-../shared/gpu-sdk}
sdk=$("$sdk_script/make-sdk.sh")
targets=(
  //rng:rng_cuda_test
  //rng:rng_cuda_sync_test
  //rng:rng_cuda_leftover_test
  //rng:rng_benchmark
  //rng:rng_nccl_benchmark
  //rng:snapshot_test
  //rng:rank_streams_test
  //rng:model_stream_test
  //rng:named_streams_test
  //rng:resume_state_test
  //rng:philox_test
  //rng:synchronize_test
  //collectives:nccl_communicator_test
  //collectives:cuda_multiprocess_test
  //collectives:nccl_benchmark
  //collectives:gloo_communicator_test
  //collectives:collectives_benchmark
  //collectives:agreement_test
  //testing:fake_communicator_test
  //collectives:communicator_base_test
  //collectives:host_lane_test
  //base:torch_boundary_test
  //base:cuda_boundary_test
  //base:logging_test
  //base:subprocess_test
  //checkpoint:checkpoint_cuda_test
  //checkpoint:checkpoint_test
  //checkpoint:checkpoint_benchmark
  //numerics:safetensors_test
  //numerics:op_recording_test
  //replay:state_replay_test
  //qualification:qualification_cuda_test
  //numerics:digest_cuda_test
  //numerics:deterministic_mode_cuda_test
  //numerics:op_recorder_test
  //numerics:op_recorder_cuda_test
  //numerics:op_recorder_benchmark
  //qualification:operator_localization_cuda_test
  //numerics:compare_cuda_test
  //numerics:divergence_cuda_test
  //numerics:numerics_benchmark
  //numerics:compare_test
  //numerics:inventory_test
  //numerics:divergence_test
  //numerics:repeatability_test
  //numerics:execution_context_test
  //numerics:xxh3_chunk_test
  //invariant:ops_test
  //invariant:ops_cuda_test
  //invariant:exact_gradients_test
  //invariant:invariant_benchmark
  //rng:cpu_generator_state_test
  //admission:admission_cuda_test
  //admission:admission_test
  //admission:recovery_test
  //admission:recovery_process_test
  //admission:ledger_test
  //admission:admission_benchmark
  //qualification:oracle_cuda_test
  //qualification:oracle_test
  //trainer:trainer_rank_test
  //trainer:trainer_contract_test
  //trainer:trainer_admission_cuda_test
  //trainer:trainer_contract_cuda_test
  //trainer:trainer_rank_cuda_test
  //qualification:variability_cuda_test
  //qualification:variability_test
  //collectives:differentiable_test
  //collectives:adopted_communicator_test
  //trainer:trainer_benchmark
  //tools:qualify
  //tools:launch
  //tools:compare
  //tools:diverge
  //tools:replay
  //examples:train
)
subset=0
if (($# > 0)); then
  targets=("$@")
  subset=1
fi
# The Python package for the device's Python 3.12 and torch 2.11 (third_party/python/h200): its
# headers, and a link stub of its libtorch_python beside the SDK's other stubs.
python_headers=/tmp/lockstep-python3.12-include
if [[ ! -f $python_headers/python3.12/Python.h ]]; then
  rm -rf "$python_headers" && mkdir -p "$python_headers"
  tar -xJf third_party/python/h200/python3.12-include.tar.xz -C "$python_headers"
fi
if [[ ! -f $sdk/lib/libtorch_python.so ]]; then
  xz -dc third_party/python/h200/libtorch_python.so.syms.xz > "$sdk/lib/libtorch_python.so.syms"
  python3 "$sdk_script/make_stub.py" "$sdk/lib/libtorch_python.so.syms" "$sdk/lib/torch_python.s"
  gcc -shared -nostdlib -Wl,-soname,libtorch_python.so -o "$sdk/lib/libtorch_python.so" \
    "$sdk/lib/torch_python.s"
  rm -f "$sdk/lib/libtorch_python.so.syms" "$sdk/lib/torch_python.s"
fi
python=1
((subset)) && python=${BUNDLE_PYTHON:-0}
extra=()
((python)) && extra=(//python/wheel:wheel)
bazel build -c opt --config=cuda --repo_env=LIBTORCH="$sdk" \
  --repo_env=PYTHON_INCLUDE="$python_headers/python3.12" "${targets[@]}" "${extra[@]}"
bins=()
for t in "${targets[@]}"; do bins+=("bazel-bin/$(sed 's|^//||; s|:|/|' <<<"$t")"); done
rm -rf .gpu-bundle
SDK=$sdk "$sdk_script/bundle.sh" .gpu-bundle "${bins[@]}"
# Our run.sh: the SDK's, plus the tests that did not run (too few GPUs) named and counted as not
# run, never as passed.
cp tools/gpu_run.sh .gpu-bundle/run.sh
if ((python)); then
# The wheel for the device's Python 3.12 and torch 2.11 (the one path: the same target
# tools/build_wheel.sh builds), its checks and test, and the pytest suites: python/gpu_run.sh
# installs it into a fresh environment there and runs python/wheel/wheel_test.sh --cuda.
mkdir -p .gpu-bundle/python/wheel
cp bazel-bin/python/wheel/lockstep.whl bazel-bin/python/wheel/wheel_name.txt \
  python/wheel/check_wheel.py python/wheel/elf.py python/wheel/wheel_test.sh \
  numerics/digest_reference.py .gpu-bundle/python/wheel/
cp -r python/tests python/bench python/gpu_run.sh .gpu-bundle/python/
chmod -R u+w .gpu-bundle/python
# The example's end-to-end test, run there with LM_BIN=bin LM_TRAIN_FLAGS=--device=cuda.
mkdir -p .gpu-bundle/examples
cp -r examples/lm/train_test.sh examples/lm/invariant_test.sh examples/lm/replay_test.sh examples/lm/operators_test.sh \
  examples/lm/deterministic_cost.sh examples/lm/cublas_call_probe.py examples/lm/plot_loss.py examples/lm/python .gpu-bundle/examples/
# The Qwen-shaped LoRA program that python3 -m lockstep.verify checks, and its cost benchmark.
cp -r examples/lora .gpu-bundle/examples/
fi
# The binaries find their libraries through run.sh's LD_LIBRARY_PATH; the runfiles trees would
# only add copies of the SDK's link stubs (hundreds of MB). A test's own data files (those it
# opens by their workspace path, as numerics/testdata/*.safetensors) go beside the binaries
# instead: run.sh runs each test from bin/, where those paths then resolve.
for tree in .gpu-bundle/bin/*.runfiles/lockstep; do
  [[ -d $tree ]] || continue
  (cd "$tree" && find . -path ./_solib_k8 -prune -o -type f ! -name '*.so*' ! -perm -u+x -print) |
    while read -r f; do mkdir -p ".gpu-bundle/bin/$(dirname "$f")" && cp -nL "$tree/$f" ".gpu-bundle/bin/$f"; done
done
rm -rf .gpu-bundle/bin/*.runfiles
# In a second worktree .git is a file; git names the exclude file of either kind.
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu-bundle/' "$exclude" 2>/dev/null || echo '/.gpu-bundle/' >> "$exclude"
du -sh .gpu-bundle
