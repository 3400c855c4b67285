#!/usr/bin/env bash
# The state-replay protocol (tools/replay.cc) over the example at DP2 x CP2:
#   1. reference, independent, resumed and the three broken resumes (rng, optimizer, data): exit 0;
#      report.json says the normal runs match byte for byte and names, for each broken resume,
#      the first differing step (the first after the resume), a rank and a path of the omitted
#      part (rng/..., optimizer/..., data/position), with its byte offset and element index;
#   2. a capture truncated, and a rank's capture without its completion record: exit 2, naming it;
#   3. a capture from another build (its execution context's lockstep_commit changed, the
#      completion record re-sealed to match): exit 2, naming the field;
#   4. a normal run that differs (one weight byte flipped, re-sealed): exit 1, naming the step,
#      rank, path, byte and element;
# and the report's page (report) of the passing run shows the verdict and the differences (where
# there is no report binary, as in the GPU bundle: "NOT RUN: the report page", and the test counts
# as not run, docs/building.md).
# REPLAY_BIN names the folder of replay and train (the GPU bundle); REPLAY_TRAIN_FLAGS adds flags
# to every launch (--device=cuda --deterministic on the H200). REPLAY_PROGRAM replaces the
# program: the Python twin, "python3 examples/lm/python/train.py", with REPLAY_PYTHONPATH naming
# the lockstep package (//examples:replay_python_test); REPLAY_PROGRAM_RNG then names a program
# generator every capture's index must declare.
set -euo pipefail
replay=${REPLAY_BIN:-tools}/replay
python=${REPLAY_PYTHON:-/usr/bin/python3}
read -r -a program <<<"${REPLAY_PROGRAM:-${REPLAY_BIN:-examples}/train}"
[[ -n ${REPLAY_PYTHONPATH:-} ]] && export PYTHONPATH=$(realpath "$REPLAY_PYTHONPATH")
read -r -a extra <<<"${REPLAY_TRAIN_FLAGS:-}"
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/replay.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$replay" --out="$tmp/run" --nproc=4 --steps=4 --resume_step=2 --broken=rng,optimizer,data \
  -- "${program[@]}" --cp=2 --sequences_per_step=8 --log_every=1000 "${extra[@]+"${extra[@]}"}" \
  | tee "$tmp/replay.out" || fail "replay exited $? (want 0)"
if [[ -n ${REPLAY_PROGRAM_RNG:-} ]]; then
  grep -q "\"$REPLAY_PROGRAM_RNG\"" "$tmp/run/reference/captures/step1/rank0/index.json" \
    || fail "the capture's index does not declare the program's $REPLAY_PROGRAM_RNG"
fi

# What the report says, checked by Python (json): the kinds' paths and the positions.
"$python" - "$tmp/run/report.json" <<'PY' || fail "report.json does not say what it should"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["verdict"] == "pass" and r["exit_code"] == 0, r["verdict"]
by = {c["name"]: c for c in r["comparisons"]}
for name in ("independent", "resumed"):
    assert by[name]["verdict"] == "as_expected" and "first_difference" not in by[name], by[name]
assert by["independent"]["captures_compared"] == 4 * 4, by["independent"]
assert by["resumed"]["captures_compared"] == 2 * 4, by["resumed"]
want = {"broken-rng": "rng/caller/cpu", "broken-optimizer": "optimizer/", "broken-data": "data/position"}
for name, prefix in want.items():
    d = by[name]["first_difference"]
    assert d["step"] == 3, (name, d)
    assert d["path"].startswith(prefix), (name, d["path"])
    assert d["kind"] == "bytes" and d["byte_offset"] >= 0 and d["element_index"] >= 0, d
    print(f"{name}: step {d['step']} rank {d['rank']} {d['path']} byte {d['byte_offset']} "
          f"element {d['element_index']} ({d['a']} vs {d['b']})")
PY

# The report's page (report): the verdict and each broken resume's first difference.
report=${REPLAY_REPORT:-report/report}
if [[ -x $report ]]; then
  MPLCONFIGDIR="$tmp/mpl" "$report" "$tmp/run/report.json" "$tmp/page" >/dev/null \
    || fail "report could not render report.json"
  for text in "<p class='verdict'>PASS (exit 0)" "<td>broken-rng</td>" "<td>rng/caller/cpu</td>" \
    "<td>data/position</td>"; do
    grep -qF "$text" "$tmp/page/index.html" || fail "the replay page lacks $text"
  done
  echo "report page: $tmp/page/index.html ($(wc -c <"$tmp/page/index.html") bytes)"
elif [[ -n ${TEST_SRCDIR:-} ]]; then
  # Under Bazel the report is a data dependency of this test: missing, it is a packaging bug.
  fail "no report binary at $report"
else
  echo "NOT RUN: the report page (no $report here)"
fi

# Evidence damaged in a copy of the run; the tool re-compares without launching (--compare_only).
damaged() {  # name: a fresh copy of the run's launches, report removed
  rm -rf "$tmp/$1" && cp -r "$tmp/run" "$tmp/$1" && rm -f "$tmp/$1/report.json"
}
expect_exit() {  # want name pattern
  local want=$1 name=$2 pattern=$3 code=0
  "$replay" --out="$tmp/$name" --compare_only --nproc=4 --steps=4 --resume_step=2 \
    --broken=rng,optimizer,data >"$tmp/$name.out" 2>&1 || code=$?
  [[ $code == "$want" ]] || { cat "$tmp/$name.out"; fail "$name: exit $code, want $want"; }
  grep -q -- "$pattern" "$tmp/$name.out" || { cat "$tmp/$name.out"; fail "$name: no '$pattern'"; }
  echo "$name: exit $code, $(grep -m1 -- "$pattern" "$tmp/$name.out")"
}
reseal() {  # capture dir: complete.json's hashes made to match its files again
  "$python" - "$1" <<'PY'
import hashlib, json, sys
d = sys.argv[1]
c = json.load(open(d + "/complete.json"))
for key, name in (("state_sha256", "state.safetensors"), ("index_sha256", "index.json")):
    c[key] = hashlib.sha256(open(f"{d}/{name}", "rb").read()).hexdigest()
json.dump(c, open(d + "/complete.json", "w"))
PY
}

# 2. Truncated, and a rank that did not complete.
damaged truncated
truncate -s 1000 "$tmp/truncated/resumed/captures/step3/rank2/state.safetensors"
expect_exit 2 truncated "step3/rank2/state.safetensors: not a valid safetensors file"
damaged partial
rm "$tmp/partial/independent/captures/step4/rank1/complete.json"
expect_exit 2 partial "step4/rank1 is partial"

# 3. Another build.
damaged other_build
capture="$tmp/other_build/independent/captures/step1/rank3"
"$python" - "$capture/index.json" <<'PY'
import json, sys
i = json.load(open(sys.argv[1]))
i["context"]["stable"]["lockstep_commit"] = "0" * 40
json.dump(i, open(sys.argv[1], "w"))
PY
reseal "$capture"
expect_exit 2 other_build "differ in lockstep_commit"

# 4. A normal run that differs: the last byte of a resumed capture's last weight flipped.
damaged mismatch
capture="$tmp/mismatch/resumed/captures/step4/rank0"
"$python" - "$capture/state.safetensors" <<'PY'
import json, struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
name = [k for k in header if k.startswith("weights/")][-1]
begin, end = header[name]["data_offsets"]
data[8 + n + end - 1] ^= 1
open(path, "wb").write(data)
print("flipped the last byte of", name)
PY
reseal "$capture"
expect_exit 1 mismatch "resumed vs reference: differ first at step 4 rank 0 path weights/"

# 5. What a capture says of itself is checked against where it sits and what the run declared
# (Note [A capture against its place]): each of these gave PASS or an abort before.
damaged mistyped  # the real example's index, a field of the wrong type, sealed again
capture="$tmp/mistyped/resumed/captures/step4/rank1"
"$python" - "$capture/index.json" <<'PY'
import json, sys
i = json.load(open(sys.argv[1]))
i["step"] = "4"
json.dump(i, open(sys.argv[1], "w"))
PY
reseal "$capture"
expect_exit 2 mistyped "index.json: 'step' is string, not"
damaged relabelled  # rank 1's capture replaced by rank 0's, whole and sealed
for file in index.json complete.json state.safetensors; do
  cp "$tmp/relabelled/independent/captures/step2/rank0/$file" \
    "$tmp/relabelled/independent/captures/step2/rank1/$file"
done
expect_exit 2 relabelled "says rank 0, but its folder says 1"
damaged linked  # a run's captures linked to another run's
rm -rf "$tmp/linked/independent/captures/step3"
ln -s "$tmp/linked/reference/captures/step3" "$tmp/linked/independent/captures/step3"
expect_exit 2 linked "step3 is a symbolic link"
# Read as one rank, a four-rank run whose rank 1 is truncated: refused by its world size.
damaged one_rank
truncate -s 1000 "$tmp/one_rank/resumed/captures/step3/rank1/state.safetensors"
code=0
"$replay" --out="$tmp/one_rank" --compare_only --nproc=1 --steps=4 --resume_step=2 \
  --broken=rng,optimizer,data >"$tmp/one_rank.out" 2>&1 || code=$?
[[ $code == 2 ]] && grep -q "says world_size 4, but the run says 1" "$tmp/one_rank.out" ||
  { cat "$tmp/one_rank.out"; fail "one_rank: exit $code, want 2 naming the world size"; }
# report.json planted as a link to a file of someone else's: refused, the file untouched.
damaged planted_report
echo "not yours" >"$tmp/victim.txt"
ln -s "$tmp/victim.txt" "$tmp/planted_report/report.json"
code=0
"$replay" --out="$tmp/planted_report" --compare_only --nproc=4 --steps=4 --resume_step=2 \
  --broken=rng,optimizer,data >"$tmp/planted_report.out" 2>&1 || code=$?
[[ $code == 2 && $(cat "$tmp/victim.txt") == "not yours" ]] ||
  { cat "$tmp/planted_report.out"; fail "planted_report: exit $code, or the link's target was written"; }

# 6. A broken resume that matches the reference (its omitted restore went unseen): the resumed
# run's captures, which match, stand in for broken-rng's.
damaged broken_matches
for step in "$tmp/broken_matches/resumed/captures"/step*; do
  rm -rf "$tmp/broken_matches/broken-rng/captures/$(basename "$step")"
  cp -r "$step" "$tmp/broken_matches/broken-rng/captures/"
done
expect_exit 1 broken_matches "broken-rng vs reference: match.*MISMATCH: the omitted restore went unseen"
"$python" - "$tmp/broken_matches/report.json" <<'PY' || fail "broken_matches: report.json"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["exit_code"] == 1, r["exit_code"]
by = {c["name"]: c for c in r["comparisons"]}
assert by["broken-rng"]["expected"] == "differ" and by["broken-rng"]["verdict"] == "mismatch", by["broken-rng"]
PY
echo "PASS"
