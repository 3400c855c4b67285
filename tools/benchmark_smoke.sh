#!/usr/bin/env bash
# Each benchmark once at a minimal size, as a smoke test: it builds, runs and measures; its
# figures are not judged (a benchmark exits non-zero when it cannot measure). CI runs it
# (.ci/run); so can anyone, from any directory:
#   tools/benchmark_smoke.sh [target ...]   (default: every benchmark)
# The benchmarks: every cc_binary named *_benchmark (a bazel query) and
# the Python ones (python/bench/handback_benchmark.py, examples/lora/cost_benchmark.py). A
# gpu-tagged one (CUDA-only, from the GPU bundle) is not
# run here; one with no smoke arguments below fails, so a new benchmark is never left out.
# Prints "benchmark smoke: N benchmarks: ...", then one line per benchmark,
#   benchmark smoke: <target> PASSED | FAILED: why | NOT RUN: why
# (with the tail of its output when it fails) and exits non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
python=/usr/bin/python3
handback=python/bench/handback_benchmark.py
lora=examples/lora/cost_benchmark.py
python_benchmarks=("$handback" "$lora")
is_python() { [[ $1 == "$handback" || $1 == "$lora" ]]; }

# Each one's smallest run: a --benchmark_filter of its smallest cases and the shortest time for
# Google Benchmark's (cases with a fixed iteration count keep it), or its own flags. About 90 s
# in all on a 2-core machine (fastbuild), most of it checkpoint's and op_recorder's fixed loops.
declare -A smoke_args=(
  [//admission:admission_benchmark]="--benchmark_min_time=0.01"
  [//checkpoint:checkpoint_benchmark]=""  # on the CPU, one case of 12 paired iterations
  [//collectives:collectives_benchmark]="--benchmark_filter=bytes:16/ --benchmark_min_time=0.01"
  [//invariant:invariant_benchmark]=""  # on the CPU, its two cases of 10 paired iterations
  [//numerics:numerics_benchmark]="--benchmark_filter=BM_(Digest|Compare|Copy)/cpu --benchmark_min_time=0.01"
  [//numerics:op_recorder_benchmark]=""  # on the CPU, its small step only
  [//planner:planner_benchmark]="--benchmark_filter=sequences:10000/cp:1/|BM_PlanAndDigestOneSequence --benchmark_min_time=0.01"
  [//rng:rng_benchmark]="--benchmark_filter=BM_ModelStreamScope|procs:2|elements:1048576/ --benchmark_min_time=0.01"
  [//trainer:trainer_benchmark]="--procs=2 --tokens=64 --width=32 --hidden=64 --iterations=10"
  [$handback]="--world 2 --iterations 20"
  [$lora]="--repeats=3 --warmup=1"
)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
benchmarks=("$@")
gpu=()
if [[ ${#benchmarks[@]} == 0 ]]; then
  query='attr(name, "_benchmark$", kind(cc_binary, //...))'
  if ! bazel query --noshow_progress "$query" >"$work/all" 2>"$work/query.err" ||
     ! bazel query --noshow_progress "attr(tags, '\bgpu\b', $query)" >"$work/gpu" 2>>"$work/query.err"; then
    echo "benchmark smoke: 1 benchmarks: the query"
    echo "benchmark smoke: //... FAILED: the query for the benchmarks failed: $(tail -1 "$work/query.err")"
    exit 1
  fi
  mapfile -t benchmarks <"$work/all"
  mapfile -t gpu <"$work/gpu"
  benchmarks+=("${python_benchmarks[@]}")
fi
echo "benchmark smoke: ${#benchmarks[@]} benchmarks: ${benchmarks[*]}"
is_gpu() { local g; for g in "${gpu[@]+"${gpu[@]}"}"; do [[ $g == "$1" ]] && return 0; done; return 1; }

# What runs here, built (a no-op after .ci/run's build of every target); --keep_going, so one that
# does not build fails alone.
build=()
for b in "${benchmarks[@]}"; do
  if is_python "$b"; then build+=(//python:package); elif ! is_gpu "$b"; then build+=("$b"); fi
done
bazel build --keep_going "${build[@]}" >"$work/build.log" 2>&1 || tail -30 "$work/build.log"
bin=$(bazel info bazel-bin 2>/dev/null)

failures=0
for b in "${benchmarks[@]}"; do
  if is_gpu "$b"; then
    echo "benchmark smoke: $b NOT RUN: a GPU benchmark (tagged gpu, CUDA-only): it runs from the GPU bundle"
    continue
  fi
  if [[ -z ${smoke_args[$b]+set} ]]; then
    echo "benchmark smoke: $b FAILED: no smoke arguments for it in tools/benchmark_smoke.sh"
    failures=$((failures + 1))
    continue
  fi
  read -r -a args <<<"${smoke_args[$b]}"
  if is_python "$b"; then
    command=(env "PYTHONPATH=$bin/python/pkg:$(dirname "$b")" "$python" "$b")
    binary=$bin/python/pkg/lockstep/_C.so
  else
    binary=$bin/$(sed 's|^//||; s|:|/|' <<<"$b")
    command=("$binary")
  fi
  if [[ ! -e $binary ]]; then
    echo "benchmark smoke: $b FAILED: it did not build ($binary is missing)"
    failures=$((failures + 1))
    continue
  fi
  mkdir -p "$work/tmp"
  log=$work/$(tr '/:' '__' <<<"$b").log
  start=$SECONDS
  TEST_TMPDIR=$work/tmp TMPDIR=$work/tmp timeout 600 "${command[@]}" "${args[@]}" >"$log" 2>&1
  rc=$?
  if [[ $rc == 0 ]]; then
    echo "benchmark smoke: $b PASSED ($((SECONDS - start)) s)"
  else
    tail -20 "$log"
    why="exit $rc"
    [[ $rc == 124 ]] && why="timed out after 600 s"
    echo "benchmark smoke: $b FAILED: $why after $((SECONDS - start)) s (arguments: ${args[*]})"
    failures=$((failures + 1))
  fi
done
exit $((failures > 0))
