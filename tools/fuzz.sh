#!/usr/bin/env bash
# Builds lockstep's fuzz targets with clang, libFuzzer, ASan and UBSan (--config=fuzz, in an
# output base of its own so the default build is not reconfigured) and runs each for a set time,
# starting from its seeds (base/fuzz_target.h). Afterwards the corpus each search built is
# replayed under valgrind through the default build's replay binary, which catches invalid reads
# inside the uninstrumented LibTorch that ASan cannot see. The Python target report_fuzz
# (report/report_fuzz.py: hypothesis over the report page's evidence) needs no build.
#
# Usage: tools/fuzz.sh [seconds per target, default 600] [target ...]  (default: every target,
# report_fuzz too)
# Work goes to $FUZZ_DIR (default ~/.cache/lockstep-fuzz; the corpora persist between runs).
# Prints one line "fuzz result: <target> PASSED|FAILED ..." per target and exits non-zero on any
# finding (the crashing input is kept under $FUZZ_DIR/<target>/), when a target cannot run, or
# when the query for the targets fails or finds none (exit 2).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
targets=("$@")
tmp_err=$(mktemp)
trap 'rm -f "$tmp_err"' EXIT
if [[ ${#targets[@]} == 0 ]]; then
  # Every fuzz target (base/fuzz.bzl tags them). A query that fails, or finds none, is an error:
  # it would otherwise fuzz nothing and pass.
  if ! query=$(bazel query --noshow_progress 'attr(tags, "\bfuzz\b", kind(cc_binary, //...))' 2>"$tmp_err"); then
    echo "fuzz: the query for the fuzz targets failed:" >&2
    tail -20 "$tmp_err" >&2
    exit 2
  fi
  mapfile -t targets <<<"$query"
  [[ -n $query ]] || { echo "fuzz: the query found no fuzz targets" >&2; exit 2; }
  targets+=(report_fuzz)
fi
echo "fuzz: ${#targets[@]} targets: ${targets[*]}"
[[ $seconds =~ ^[0-9]+$ && $seconds -ge 1 ]] || { echo "fuzz: seconds '$seconds' is not a positive integer" >&2; exit 2; }
python_targets=()  # run by Debian's python3, not built
cc_targets=()
for target in "${targets[@]}"; do
  if [[ $target == report_fuzz ]]; then python_targets+=("$target"); else cc_targets+=("$target"); fi
done
targets=("${cc_targets[@]}")
fuzz_dir=${FUZZ_DIR:-$HOME/.cache/lockstep-fuzz}
mkdir -p "$fuzz_dir"
status=0
for target in "${python_targets[@]}"; do
  echo "fuzz: $target for ${seconds}s (log $fuzz_dir/$target.log)"
  if HYPOTHESIS_STORAGE_DIRECTORY="$fuzz_dir/$target" \
    /usr/bin/python3 report/report_fuzz.py "$seconds" >"$fuzz_dir/$target.log" 2>&1; then
    tail -1 "$fuzz_dir/$target.log"
    echo "fuzz result: $target PASSED"
  else
    rc=$?
    tail -40 "$fuzz_dir/$target.log"
    echo "fuzz result: $target FAILED (exit $rc)"
    status=1
  fi
done
[[ ${#targets[@]} -gt 0 ]] || exit $status
command -v clang >/dev/null || { echo "fuzz: clang is not installed (./setup.sh installs it)" >&2; exit 2; }
# One output base per checkout (Bazel ties an output base to its workspace); the disk cache in
# .bazelrc is shared, so a fresh clone still reuses earlier compilations.
output_base=${FUZZ_OUTPUT_BASE:-$HOME/.cache/lockstep-fuzz-output-base/$(pwd | md5sum | cut -c1-12)}
# Inputs up to 1 MiB: large enough to reach the nesting and tensor-count limits the seeds sit
# at (libFuzzer's default follows the largest seed and starts at 4 KiB).
max_len=${FUZZ_MAX_LEN:-1048576}

bazel --output_base="$output_base" build --config=fuzz "${targets[@]}"
bazel build "${targets[@]}"  # the replay binaries, for valgrind
fuzz_bin=$(bazel --output_base="$output_base" info --config=fuzz bazel-bin)
replay_bin=$(bazel info bazel-bin)

# valgrind cannot start LibTorch binaries here without the shim (tools/valgrind/hwy_timer_shim.cc).
shim="$fuzz_dir/libhwy_timer_shim.so"
g++ -shared -fPIC -O2 -Wl,--version-script=tools/valgrind/hwy_timer_shim.map \
  -o "$shim" tools/valgrind/hwy_timer_shim.cc

for target in "${targets[@]}"; do
  path=${target#//}
  path=${path/://}
  name=$(basename "$path")
  work="$fuzz_dir/$name"
  mkdir -p "$work/corpus"
  echo "fuzz: $name for ${seconds}s (corpus $work/corpus)"
  set +e
  (cd "$work" && LOCKSTEP_FUZZ_SEED_DIR="$work/corpus" ASAN_OPTIONS=alloc_dealloc_mismatch=0 \
    "$fuzz_bin/$path" -max_total_time="$seconds" -max_len="$max_len" -rss_limit_mb=4096 -timeout=30 \
    -print_final_stats=1 corpus >"$work/fuzz.log" 2>&1)
  rc=$?
  set -e
  grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|Done)|cov: .*ft:" "$work/fuzz.log" | tail -4
  if [[ $rc != 0 ]]; then
    echo "fuzz: $name FOUND A PROBLEM (exit $rc); log $work/fuzz.log, input under $work/"
    tail -30 "$work/fuzz.log"
    echo "fuzz result: $target FAILED (libFuzzer exit $rc)"
    status=1
    continue
  fi
  corpus_size=$(ls "$work/corpus" | wc -l)
  echo "fuzz: $name clean; replaying its $corpus_size corpus inputs under valgrind"
  if ! LD_PRELOAD="$shim" valgrind --error-exitcode=99 --quiet \
    --suppressions=tools/valgrind/lockstep.supp \
    "$replay_bin/$path" "$work/corpus" >"$work/valgrind.log" 2>&1; then
    echo "fuzz: $name: valgrind reported errors (log $work/valgrind.log)"
    tail -30 "$work/valgrind.log"
    echo "fuzz result: $target FAILED (valgrind)"
    status=1
  else
    tail -1 "$work/valgrind.log"
    echo "fuzz result: $target PASSED"
  fi
done
exit $status
