#!/usr/bin/env bash
# The cost of lockstep's deterministic mode on the example's training step: the example
# (DP1 x TP1 x CP1 on one device, by default the GPU) run in pairs, without and with
# --deterministic, alternating; each run's throughput is the median of its progress lines'
# tokens/s after the first (warm-up); the cost is the median over pairs of plain / deterministic
# (1.10: the mode makes a step 10% slower). Each pair also runs a third, plain run with only the
# cuBLAS workspace setting (CUBLAS_WORKSPACE_CONFIG=:4096:8 in its environment), which splits the
# cost into cuBLAS's part and deterministic algorithms' part (the mode itself sets the variable
# only for a LibTorch that demands it: Note [cuBLAS workspace setting] in
# numerics/deterministic_mode.h). Extra train flags scale the model
# (--width, --hidden, --blocks, --max_tokens): the default model is tiny, its step bound by
# kernel launches. Run by hand (on the H200 from the GPU bundle):
#   examples/lm/deterministic_cost.sh [PAIRS] [-- extra train flags]
# LM_BIN names the folder of launch and train (default: bazel-bin's). Exits non-zero when it
# cannot measure (a run failed or printed too few progress lines).
set -euo pipefail
pairs=${1:-5}
shift || true
[[ ${1:-} == -- ]] && shift
bin=${LM_BIN:-}
launch=${bin:-bazel-bin/tools}/launch
train=${bin:-bazel-bin/examples}/train
device=${LM_DEVICE:-cuda}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
throughput() {  # log: the median tokens/s of its progress lines after the first
  grep -o 'tokens/s [0-9]*' "$1" | awk 'NR > 1 {print $2}' | sort -n |
    awk '{v[NR] = $1} END {if (NR < 3) exit 1; print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'
}
run() {  # name flags...
  local name=$1
  shift
  "$launch" --nproc=1 --deadline_seconds=600 -- "$train" --device="$device" --steps=120 \
    --log_every=20 --checkpoint_blocks=true "$@" >"$tmp/$name.log" 2>&1 ||
    { cat "$tmp/$name.log"; echo "deterministic_cost: the $name run failed" >&2; exit 1; }
  throughput "$tmp/$name.log" ||
    { cat "$tmp/$name.log"; echo "deterministic_cost: $name printed too few progress lines" >&2; exit 1; }
}
median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
ratios=()
cublas_ratios=()
for ((p = 1; p <= pairs; p++)); do
  plain=$(run "plain$p" "$@")
  cublas=$(CUBLAS_WORKSPACE_CONFIG=:4096:8 run "cublas$p" "$@")
  det=$(run "deterministic$p" --deterministic "$@")
  ratio=$(awk -v a="$plain" -v b="$det" 'BEGIN {printf "%.4f", a / b}')
  cublas_ratio=$(awk -v a="$plain" -v b="$cublas" 'BEGIN {printf "%.4f", a / b}')
  echo "pair $p: plain $plain tokens/s, cuBLAS setting only $cublas (${cublas_ratio}x)," \
    "deterministic $det tokens/s, cost ${ratio}x"
  ratios+=("$ratio")
  cublas_ratios+=("$cublas_ratio")
done
echo "deterministic mode cost on the example step ($device, $*, median of $pairs pairs):" \
  "$(printf '%s\n' "${ratios[@]}" | median)x; the cuBLAS setting alone:" \
  "$(printf '%s\n' "${cublas_ratios[@]}" | median)x"
