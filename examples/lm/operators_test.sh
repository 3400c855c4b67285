#!/usr/bin/env bash
# The operator recorder over the example, as a user runs it (tools/launch, Gloo), and tools/diverge
# on its recordings:
#   1. DP2 x CP2 run twice, step 1 recorded on every rank: every rank's two recordings agree call
#      for call (diverge exit 0) — the recorder itself adds no spurious difference (buffers
#      allocated and filled piecewise, views of them, autograd's backward threads);
#   2. the negative control: another --seed gives other weights, and diverge says the difference
#      entered outside the operators (exit 1);
#   3. a damaged recording is refused naming its file and line, and an operator recording is not
#      compared with a file of another kind (exit 2); --record_step outside the run is refused.
# OPS_BIN names the folder of launch, train and diverge (the GPU bundle); OPS_TRAIN_FLAGS adds
# flags to every run (--device=cuda --deterministic).
set -euo pipefail
launch=${OPS_BIN:-tools}/launch
train=${OPS_BIN:-examples}/train
diverge=${OPS_BIN:-tools}/diverge
read -r -a extra <<<"${OPS_TRAIN_FLAGS:-}"
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/operators.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

run() {  # name nproc flags...
  local name=$1 nproc=$2
  shift 2
  "$launch" --nproc="$nproc" --deadline_seconds=300 -- "$train" --steps=2 --log_every=1 \
    --record_operators="$tmp/$name" --record_step=1 "${extra[@]+"${extra[@]}"}" "$@" >"$tmp/$name.out" 2>&1 \
    || { cat "$tmp/$name.out"; echo "the $name run failed"; exit 1; }
}

# 1. Two identical runs record identical calls on every rank.
run a 4 --cp=2
run b 4 --cp=2
for r in 0 1 2 3; do
  out=$("$diverge" "$tmp/a/rank$r.jsonl" "$tmp/b/rank$r.jsonl") \
    || { echo "$out"; echo "rank $r: two identical runs' operator recordings differ"; exit 1; }
  echo "rank $r: $out"
  calls=$(grep -o '[0-9]* calls' <<<"$out" | cut -d' ' -f1)
  [[ $calls -gt 1000 ]] || { echo "rank $r recorded only $calls calls"; exit 1; }
done

# 2. Another seed: the difference is there from the weights on, outside any operator.
run seeded 4 --cp=2 --seed=2
set +e
out=$("$diverge" --out="$tmp/seeded.json" "$tmp/a/rank0.jsonl" "$tmp/seeded/rank0.jsonl")
code=$?
set -e
echo "$out" | head -n 1
[[ $code -eq 1 ]] || { echo "$out"; echo "diverge exited $code for runs of different seeds, not 1"; exit 1; }
grep -q "the difference entered outside the operators" <<<"$out" \
  || { echo "$out"; echo "the seed's difference was not said to enter outside the operators"; exit 1; }
grep -q '"first_inputs_differ": {' "$tmp/seeded.json" || { echo "no first_inputs_differ in --out"; exit 1; }

# 3. Bad input.
head -c 20000 "$tmp/a/rank0.jsonl" >"$tmp/truncated.jsonl"
set +e
out=$("$diverge" "$tmp/truncated.jsonl" "$tmp/b/rank0.jsonl" 2>&1)
code=$?
set -e
[[ $code -eq 2 && $out == *"truncated.jsonl:"*"not a lockstep operator recording"* ]] \
  || { echo "$out"; echo "a truncated recording gave exit $code"; exit 1; }
echo '{"not": "a recording"}' >"$tmp/other.json"
set +e
out=$("$diverge" "$tmp/a/rank0.jsonl" "$tmp/other.json" 2>&1)
code=$?
set -e
[[ $code -eq 2 && $out == *"is an operator recording and"* ]] \
  || { echo "$out"; echo "recordings of two kinds gave exit $code"; exit 1; }
set +e
out=$("$launch" --nproc=1 --deadline_seconds=60 -- "$train" --steps=2 --record_operators="$tmp/c" --record_step=5 2>&1)
code=$?
set -e
[[ $code -ne 0 && $out == *"--record_step=5 is not one of the steps"* ]] \
  || { echo "$out"; echo "--record_step=5 of a 2-step run was not refused"; exit 1; }
echo "operators_test: all passed"
