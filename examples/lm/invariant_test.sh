#!/usr/bin/env bash
# The example under placement-invariant mode (--placement_invariant, invariant/mode.h): split and
# repacked runs equal the unsplit run bit for bit.
#   1. the unsplit run (DP1 x CP1, a microbatch per sequence) for $steps steps;
#   2. the same global batch repacked under a larger token cap (--microbatch_tokens: several
#      sequences per microbatch), sharded over CP2 and CP4, and split over DP2 x CP2: every
#      step's loss (tools/compare --bitwise) and every rank's final weights equal the unsplit
#      run's, bit for bit;
#   3. the control: the same DP2 x CP2 run without the mode differs from its own unsplit run
#      (compare --bitwise FAILs), so the bitwise comparisons above can fail;
#   4. TP: TP2 under the mode is reported, not required (its MLP's partial products are summed
#      over TP in floating point: the mode's bits depend on the TP size; docs/placement_invariance.md).
# LM_BIN, LM_TRAIN_FLAGS and LM_KEEP_DIR as in train_test.sh (the GPU bundle sets LM_BIN=bin and
# LM_TRAIN_FLAGS=--device=cuda).
set -euo pipefail
launch=${LM_BIN:-tools}/launch
train=${LM_BIN:-examples}/train
compare=${LM_BIN:-tools}/compare
read -r -a extra <<<"${LM_TRAIN_FLAGS:-}"
steps=${LM_INVARIANT_STEPS:-12}
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/lm_invariant.XXXXXX")
keep() { [[ -z ${LM_KEEP_DIR:-} ]] || { mkdir -p "$LM_KEEP_DIR" && cp "$tmp"/*.csv "$tmp"/*.out "$LM_KEEP_DIR"/ 2>/dev/null; }; rm -rf "$tmp"; }
trap keep EXIT

run() {  # name nproc flags...
  local name=$1 nproc=$2
  shift 2
  local start=$SECONDS
  "$launch" --nproc="$nproc" --deadline_seconds=600 -- "$train" --steps="$steps" --log_every="$steps" \
    --log_csv="$tmp/$name.csv" --losses="$tmp/$name.safetensors" --final_state="$tmp/$name.final" \
    "${extra[@]+"${extra[@]}"}" "$@" >"$tmp/$name.out" 2>&1 \
    || { cat "$tmp/$name.out"; echo "the $name run failed"; exit 1; }
  echo "$name: $((SECONDS - start)) s, last loss $(tail -n 1 "$tmp/$name.csv" | cut -d, -f2)"
}

same() {  # name nproc: its losses and every rank's final weights equal the unsplit run's bits
  local name=$1 nproc=$2
  "$compare" --bitwise "$tmp/$name.safetensors" "$tmp/unsplit.safetensors" >"$tmp/$name.compare" \
    || { cat "$tmp/$name.compare"; echo "$name's losses differ from the unsplit run's under the mode"; exit 1; }
  for ((r = 0; r < nproc; ++r)); do
    "$compare" --bitwise "$tmp/$name.final/rank$r/weights.safetensors" \
      "$tmp/unsplit.final/rank0/weights.safetensors" >"$tmp/$name.weights" \
      || { cat "$tmp/$name.weights"; echo "$name rank $r's final weights differ from the unsplit run's"; exit 1; }
  done
  echo "$name: $steps losses and the final weights of $nproc rank(s) bit-identical to the unsplit run"
}

# 1 and 2.
run unsplit 1 --placement_invariant
run packed 1 --placement_invariant --microbatch_tokens=200
same packed 1
run cp2_packed 2 --placement_invariant --cp=2 --microbatch_tokens=130
same cp2_packed 2
run dp2_cp2 4 --placement_invariant --cp=2
same dp2_cp2 4
run cp4 4 --placement_invariant --cp=4
same cp4 4

# 3. Without the mode the same layouts differ: the comparisons above can fail.
run plain_unsplit 1
run plain_dp2_cp2 4 --cp=2
if "$compare" --bitwise "$tmp/plain_dp2_cp2.safetensors" "$tmp/plain_unsplit.safetensors" >"$tmp/plain.compare"; then
  cat "$tmp/plain.compare"
  echo "without the mode DP2 x CP2 gave the unsplit run's bits: the control cannot fail the check"
  exit 1
fi
echo "control: without the mode DP2 x CP2's losses differ from the unsplit run's ($(grep -m1 '^loss' "$tmp/plain.compare" | awk '{print "max|diff| " $4}'))"

# 4. TP2 (reported only).
run tp2 2 --placement_invariant --tp=2
if "$compare" --bitwise "$tmp/tp2.safetensors" "$tmp/unsplit.safetensors" >"$tmp/tp2.compare"; then
  echo "TP2 under the mode: losses bit-identical to the unsplit run's"
else
  echo "TP2 under the mode: losses differ from the unsplit run's ($(grep -m1 '^loss' "$tmp/tp2.compare" | awk '{print "max|diff| " $4}')): TP-size dependent, as documented"
fi
echo "PASS"
