#!/usr/bin/env bash
# qualify must pass on real topologies, fail under each negative control, and refuse bad flags.
set -euo pipefail
qualify=tools/qualify
tmp=${TEST_TMPDIR:-$(mktemp -d)}

"$qualify" --dp=2 --tp=1 --cp=2 --out="$tmp/dp2cp2.json"
grep -q '"passed": true' "$tmp/dp2cp2.json" || { echo "evidence does not say passed"; exit 1; }
grep -q "\"lockstep_commit\"" "$tmp/dp2cp2.json" || { echo "evidence lacks the execution context"; exit 1; }
# Exactly the 16 checks qualify expects at CP 2 (qualification::ExpectedChecks), each passed by
# all 4 ranks.
/usr/bin/python3 - "$tmp/dp2cp2.json" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))
expected = "replica_agreement dp_workers_independent model_stream exception_restoration partition_invariance checkpoint_recompute oom_recovery replica_outputs caller_draws stream_progression reference_match resume empty_cp_shard repeatability actors packing_invariance".split()
names = [c["name"] for c in e["checks"]]
assert names == expected, f"checks {names}, expected {expected}"
for c in e["checks"]:
    assert c["passed"] and len(c["ranks"]) == 4, (c["name"], c["passed"], len(c["ranks"]))
assert e["missing_checks"] == [], e["missing_checks"]
PY

"$qualify" --dp 2 --tp 2 --cp 1 --out "$tmp/dp2tp2.json"

# --deterministic: every worker enforces lockstep's deterministic mode and the variability
# checks' evidence says it held; a contradicting setting in the environment fails every rank,
# naming it, and is not overridden.
"$qualify" --dp=2 --tp=1 --cp=2 --deterministic --out="$tmp/deterministic.json" >/dev/null
/usr/bin/python3 - "$tmp/deterministic.json" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))
assert e["passed"], "qualify --deterministic did not pass"
for check in e["checks"]:
    if check["name"] in ("repeatability", "actors"):
        for rank in check["ranks"]:
            mode = rank["evidence"]["deterministic_mode"]
            assert mode["enforced"] and mode["holds"], (check["name"], mode)
PY
set +e
NCCL_ALGO=Tree "$qualify" --dp=2 --tp=1 --cp=2 --deterministic >"$tmp/contradiction.txt" 2>&1
status=$?
set -e
[[ $status == 1 ]] || { echo "--deterministic with NCCL_ALGO=Tree: exit $status, expected 1"; exit 1; }
grep -q "NCCL_ALGO is 'Tree' but the mode requires 'Ring'" "$tmp/contradiction.txt" \
  || { echo "the contradiction is not named:"; cat "$tmp/contradiction.txt"; exit 1; }
# Three injected failures (two split levels) on one replica of each group; the ledger summary is
# shown.
"$qualify" --dp=1 --tp=2 --cp=2 --inject_oom 3 >"$tmp/oom3.txt"
cat "$tmp/oom3.txt"
grep -q "^oom_recovery *PASS" "$tmp/oom3.txt" || { echo "oom_recovery did not pass"; exit 1; }
grep -q "3 injected" "$tmp/oom3.txt" || { echo "oom_recovery does not say 3 injected"; exit 1; }

# One spelling of flag names: a hyphenated one is refused (bad input, exit 2), naming the right one.
set +e
"$qualify" --dp=1 --tp=2 --cp=2 --inject-oom 3 >/dev/null 2>"$tmp/hyphen.txt"
status=$?
set -e
[[ $status == 2 ]] || { echo "--inject-oom: exit $status, expected 2"; exit 1; }
grep -q "use --inject_oom, not --inject-oom" "$tmp/hyphen.txt" || { cat "$tmp/hyphen.txt"; exit 1; }

# Each negative control must make qualify fail (exit 1) through the check that catches it.
expect_fail() {  # control check [topology flags, default DP2 x CP2]
  local control=$1 check=$2
  shift 2
  (($# > 0)) || set -- --dp=2 --tp=1 --cp=2
  set +e
  "$qualify" "$@" --negative_control="$control" --out="$tmp/$control.json" >"$tmp/$control.txt"
  local rc=$?
  set -e
  cat "$tmp/$control.txt"
  [[ $rc == 1 ]] || { echo "negative control $control exited $rc, expected 1"; exit 1; }
  grep -q "^$check *FAIL" "$tmp/$control.txt" || { echo "$check did not fail under $control"; exit 1; }
  grep -q '"passed": false' "$tmp/$control.json"
  tested+=("$control")
}
tested=()
expect_fail no-sync replica_agreement
expect_fail world-sync dp_workers_independent
expect_fail unscoped-model-work model_stream
expect_fail aliasing-snapshot checkpoint_recompute
expect_fail shard-local-philox partition_invariance
expect_fail double-counted-retry oom_recovery
expect_fail input-inside-scope reference_match
expect_fail no-sync-after-microbatch caller_draws
expect_fail no-sync-after-dp-forward caller_draws
expect_fail no-restore-on-unwind exception_restoration
expect_fail staging-replaces oom_recovery
expect_fail resume-without-named-streams resume
expect_fail resume-without-caller-stream resume
expect_fail resume-without-model-stream resume
expect_fail resume-without-optimizer resume
expect_fail repeatability-stream-not-restored repeatability
expect_fail misrouted-gather replica_outputs
expect_fail empty-shard-skips-gather empty_cp_shard
expect_fail actor-partial-load actors
expect_fail cp-local-attention reference_match
expect_fail tp-unreduced-gradient reference_match --dp=1 --tp=2 --cp=1
expect_fail nondeterministic-op repeatability
expect_fail libtorch-attention packing_invariance --dp=1 --tp=1 --cp=2 --placement_invariant
# Every control qualify knows (its refusal of an unknown one lists them) is tried above.
known=$("$qualify" --dp=1 --negative_control=no-such-control 2>&1 | grep -o "known: [a-z, -]*" | sed 's/known: //; s/,/ /g') || true
[[ -n $known ]] || { echo "qualify did not list its negative controls"; exit 1; }
for control in $known; do
  [[ " ${tested[*]} " == *" $control "* ]] || { echo "negative control $control is not tried here"; exit 1; }
done
# The broken module is named as the first divergence, pass to pass and actor to actor, and the
# packing check tells it from a placement effect.
grep -q "^repeatability *FAIL .*first divergence at block1.mlp (forward_output" "$tmp/nondeterministic-op.txt" \
  || { echo "repeatability did not name block1.mlp"; exit 1; }
grep -q "^actors *FAIL .*first divergence at block1.mlp" "$tmp/nondeterministic-op.txt" \
  || { echo "actors did not fail naming block1.mlp"; exit 1; }
grep -q "^packing_invariance *FAIL .*not reproducible" "$tmp/nondeterministic-op.txt" \
  || { echo "packing_invariance took nondeterminism for placement"; exit 1; }
grep -q "^reference_match *PASS" "$tmp/nondeterministic-op.txt" \
  || { echo "nondeterministic-op broke the trainer's oracle too"; exit 1; }
# Placement-invariant mode: every check passes, every placement gives each sequence the same bits;
# LibTorch's attention inside the mode is named.
"$qualify" --dp=1 --tp=1 --cp=2 --placement_invariant >"$tmp/invariant.txt"
grep -q "^packing_invariance *PASS .*bit-identical across 5 placements (and the step's 14 gradients) under placement-invariant mode" \
  "$tmp/invariant.txt" || { echo "packing_invariance not bit-identical under the mode"; cat "$tmp/invariant.txt"; exit 1; }
grep -q "^packing_invariance *FAIL .*placement-dependent under placement-invariant mode.*first differs at block0.attention" \
  "$tmp/libtorch-attention.txt" || { echo "libtorch-attention was not named at block0.attention"; exit 1; }
grep -q "^caller_draws *FAIL" "$tmp/no-sync.txt" || { echo "no-sync went unseen by the trainer's caller_draws"; exit 1; }
grep -q "^stream_progression *FAIL" "$tmp/unscoped-model-work.txt" \
  || { echo "unscoped-model-work went unseen by the trainer's stream_progression"; exit 1; }
grep -q "^replica_agreement *PASS" "$tmp/aliasing-snapshot.txt" \
  || { echo "aliasing-snapshot broke more than recompute"; exit 1; }

# Bad flags are named and exit 2, before anything starts.
bad() {  # expected-message flags...
  local want=$1
  shift
  set +e
  "$qualify" "$@" >"$tmp/bad.out" 2>"$tmp/bad.txt"
  local rc=$?
  set -e
  [[ $rc == 2 ]] || { echo "qualify $* exited $rc, expected 2"; cat "$tmp/bad.txt"; exit 1; }
  grep -q -- "$want" "$tmp/bad.txt" || { echo "qualify $*: no '$want' in:"; cat "$tmp/bad.txt"; exit 1; }
}
bad "--dp 0 is not a positive integer" --dp=0
bad "exceeds qualify's world limit of 64" --dp=2147483647
bad "--dp 64 x --tp 64 x --cp 64 = 262144 processes exceeds qualify's limit of 64" --dp=64 --tp=64 --cp=64
bad "unknown negative control 'bogus'" --negative_control=bogus
bad "unexpected argument foo" --dp=1 foo
bad "is empty" --out=
bad "dp" --dp=abc
bad "bogus" --bogus=1
bad "cannot write the evidence file" --dp=1 --out=/nonexistent-dir/qualify.json
bad "--worker needs --results_dir" --worker
bad "libtorch-attention breaks placement-invariant mode: add --placement_invariant" --dp=1 --negative_control=libtorch-attention
bad "--deadline_seconds -1s must be positive" --dp=1 --deadline_seconds=-1
bad "--inject_oom 9 is outside \[1, 8\]" --dp=1 --inject_oom=9
bad "--inject_oom 0 is outside \[1, 8\]: oom_recovery needs at least one injected failure" --dp=1 --inject_oom=0
bad "--device 'tpu' is neither cpu nor cuda" --dp=1 --device=tpu
bad "cannot write the report directory '/proc/qualify-report'" --dp=1 --report=/proc/qualify-report
# Nothing is imported from the report folder, which another user may share: modules planted
# there under the names the page's script imports never run.
mkdir -p "$tmp/planted"
for module in html json io math os sys matplotlib; do
  echo "open('$tmp/planted_ran', 'a').write('$module ')" >"$tmp/planted/$module.py"
done
MPLCONFIGDIR="$tmp/matplotlib" "$qualify" --dp=1 --report="$tmp/planted" >"$tmp/planted.txt" 2>&1 ||
  { cat "$tmp/planted.txt"; echo "qualify --report into a folder with planted modules failed"; exit 1; }
[[ ! -e $tmp/planted_ran ]] || { echo "qualify ran modules planted in its report folder: $(cat "$tmp/planted_ran")"; exit 1; }
[[ -s $tmp/planted/index.html ]] || { echo "no page was written"; exit 1; }
bad "--nnodes 3 does not divide the world of 4 processes" --dp=2 --cp=2 --nnodes=3 --master_port=29500
bad "--master_port 0 with --nnodes 2" --dp=2 --cp=2 --nnodes=2
bad "--node_rank 2 is not an integer in \[0, 2)" --dp=2 --cp=2 --nnodes=2 --node_rank=2 --master_port=29500
# A flag that merely starts like a usage flag is an unknown flag, not usage (exit 0 or 1).
bad "helpfoo" --helpfoo
# Usage asked for is printed and is a success (status 0), as argparse and torchrun do.
"$qualify" --help >"$tmp/help.out" 2>&1 || { echo "qualify --help exited $?"; exit 1; }
grep -q -- "--dp" "$tmp/help.out" || { cat "$tmp/help.out"; echo "qualify --help lists no --dp"; exit 1; }
# What the reference model or this build cannot run is refused before any worker starts.
bad "--tp 3 does not divide the reference model's 16 hidden units.*use --tp 1, 2, 4, 8, 16" --dp=1 --tp=3
if ! nvidia-smi -L >/dev/null 2>&1; then
  bad "--device cuda: \(this qualify was built without CUDA\|no CUDA device is visible\)" --dp=1 --device=cuda
fi
# An unwritable evidence path is found before the job: nothing is created, no worker started.
bad "cannot write the evidence file '/proc/qualify.json'" --dp=1 --out=/proc/qualify.json
grep -q "working directory" "$tmp/bad.out" && { echo "a worker directory was made for bad input"; exit 1; }

# A qualify killed outright leaves the previous evidence whole (nothing half-written under its
# name) and has said where its working directory is, under TMPDIR.
mkdir -p "$tmp/killed_tmp"
echo '{"previous": true}' >"$tmp/killed.json"
cp "$tmp/killed.json" "$tmp/previous.json"
env -u TEST_TMPDIR TMPDIR="$tmp/killed_tmp" "$qualify" --dp=2 --tp=1 --cp=2 --out="$tmp/killed.json" >"$tmp/killed.txt" 2>&1 &
pid=$!
for _ in $(seq 200); do grep -q "^working directory: " "$tmp/killed.txt" && break; sleep 0.05; done
sleep 1  # the workers running
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
cmp "$tmp/killed.json" "$tmp/previous.json" || { echo "a killed qualify changed the evidence"; exit 1; }
workdir=$(sed -n 's/^working directory: \([^ ]*\) .*/\1/p' "$tmp/killed.txt")
[[ $workdir == "$tmp/killed_tmp/"* && -d $workdir ]] \
  || { echo "the working directory '$workdir' is not the one named under TMPDIR"; cat "$tmp/killed.txt"; exit 1; }
echo "qualify test: ok"
