#!/usr/bin/env bash
# planner_needs_no_libtorch_test.sh DEPS BINARY: @lockstep//planner's dependencies (a genquery's
# output) name no LibTorch target, and a binary linking only the planner loads no LibTorch.
set -euo pipefail
deps=$1 binary=$2
grep -q '@lockstep//planner:planner' "$deps" || { echo "FAIL: $deps does not list the planner"; exit 1; }
if grep -E '^@libtorch//|torch' "$deps"; then
  echo "FAIL: the planner's dependencies above name LibTorch"
  exit 1
fi
if ldd "$binary" | grep -E '^\s*(libtorch|libc10)[^ ]* =>'; then
  echo "FAIL: $binary loads LibTorch (above)"
  exit 1
fi
echo "the planner's $(wc -l < "$deps") dependencies and its test binary are free of LibTorch"
