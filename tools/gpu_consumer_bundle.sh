#!/usr/bin/env bash
# Installs lockstep built against the LibTorch 2.11 + CUDA 13 SDK (../shared/gpu-sdk) with
# --config=cuda, builds the CMake consumer (consumers/cmake) against that install and the SDK's
# Torch package, and packs the consumer's test into .gpu-bundle/ for the H200:
#   tools/gpu_consumer_bundle.sh            then, on the device:  ./.gpu-bundle/run.sh
# The consumer is configured against a view of the SDK that differs in two ways: the protobuf
# headers that pip/zip LibTorch trees bundle (include/google) are left out, as lockstep's own
# build leaves them out (third_party/libtorch/repository.bzl): they would shadow the system
# protobuf that lockstep's generated headers are for; and the SDK's Torch package names
# libtorch_nvshmem.so, which the SDK has no stub for: an empty stand-in (the device has the real one).
set -euo pipefail
cd "$(dirname "$0")/.."
sdk_script=${GPU_SDK:-../shared/gpu-sdk}
sdk=$("$sdk_script/make-sdk.sh")
work=$PWD/.gpu-install
rm -rf "$work" && mkdir -p "$work/sdk"
bazel run -c opt --config=cuda --repo_env=LIBTORCH="$sdk" //install -- --prefix="$work/prefix"
for entry in "$sdk"/*; do ln -s "$entry" "$work/sdk/"; done
rm "$work/sdk/lib" && mkdir "$work/sdk/lib" && ln -s "$sdk"/lib/* "$work/sdk/lib/"
rm "$work/sdk/include" && mkdir "$work/sdk/include"
for entry in "$sdk"/include/*; do [[ ${entry##*/} == google ]] || ln -s "$entry" "$work/sdk/include/"; done
[[ -e $work/sdk/lib/libtorch_nvshmem.so ]] ||
  gcc -shared -nostdlib -Wl,-soname,libtorch_nvshmem.so -o "$work/sdk/lib/libtorch_nvshmem.so" -x c /dev/null
cmake -S consumers/cmake -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix;$work/sdk"
cmake --build "$work/build" -j "$(nproc)"
rm -rf .gpu-bundle
SDK=$sdk "$sdk_script/bundle.sh" .gpu-bundle "$work/build/service_test"
cp tools/gpu_run.sh .gpu-bundle/run.sh
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
for p in /.gpu-bundle/ /.gpu-install/; do grep -qx "$p" "$exclude" 2>/dev/null || echo "$p" >> "$exclude"; done
ls "$work/prefix/lib" | sed 's/^/installed: /'
du -sh .gpu-bundle
