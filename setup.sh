#!/usr/bin/env bash
# Installs every Debian 12 package that building and testing lockstep needs. Idempotent: run it
# as often as you like (as root, or with sudo available).
set -euo pipefail
packages=(
  bazel-bootstrap            # Bazel 4.2.3, offline with the WORKSPACE's local rule stand-ins
  g++ git python3 xz-utils clang-format
  cmake make patchelf        # //install: the CMake consumer (consumers/cmake); run paths of the libraries
  libtorch-dev               # LibTorch 1.13 (CPU) with c10d and Gloo
  libgloo-dev                # Gloo headers, included by c10d's ProcessGroupGloo.hpp
  libabsl-dev
  libgoogle-glog-dev libgflags-dev
  libprotobuf-dev protobuf-compiler
  libgtest-dev libgmock-dev
  libbenchmark-dev
  libssl-dev                 # OpenSSL's libcrypto: SHA-256
  nlohmann-json3-dev         # JSON evidence written by the tools; safetensors headers
  libxxhash-dev              # XXH3-128: numerics' tensor and state digests
  python3-xxhash             # numerics/digest_reference.py, the digest's reference
  clang libclang-rt-14-dev   # tools/fuzz.sh: clang with libFuzzer and the sanitizers
  valgrind                   # tools/fuzz.sh: the corpora replayed under memcheck
  libsqlite3-dev sqlite3     # admission's recovery ledger; sqlite3 to inspect one
  python3-matplotlib         # examples/lm/plot_loss.py, report: plots as SVG
  python3-hypothesis         # report/report_fuzz.py: the report page's fuzz target
  chromium                   # report's test: the page loaded and screenshot headless
  iproute2 procps            # the multi-host tests' namespaced hosts: ip, tc; pgrep, pkill
  python3-dev python3-torch  # the Python package (//python): headers, and torch on the same LibTorch
  pybind11-dev python3-pytest
  python3-venv python3-pip   # the wheel (//python/wheel): installed into a fresh environment
  python3-wheel binutils     # ...packed (wheel pack); readelf for its checks
  doxygen                    # tools/apidocs.sh: the API reference from the public headers
)
sudo=""
[[ $(id -u) == 0 ]] || sudo=sudo
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${packages[@]}"
fi
echo "setup: all ${#packages[@]} packages present"
