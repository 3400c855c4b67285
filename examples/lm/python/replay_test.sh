#!/usr/bin/env bash
# The state-replay protocol (tools/replay) over the Python twin (train.py) at DP2 x CP2, as
# examples/lm/replay_test.sh runs it over the C++ example: the reference, independent and resumed
# runs match byte for byte, and each broken resume (rng, optimizer, data) is caught at the first
# step after the resume, named by a path of the part it left out.
set -euo pipefail
root=${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-lockstep}}
cd "${root:-$(dirname "$0")/../../..}"
replay=${REPLAY_BIN:-tools}/replay
python=${REPLAY_PYTHON:-/usr/bin/python3}
export PYTHONPATH=${REPLAY_PYTHONPATH:-$PWD/python/pkg}
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/replay_py.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$replay" --out="$tmp/run" --nproc=4 --steps=4 --resume_step=2 --broken=rng,optimizer,data \
  -- "$python" examples/lm/python/train.py --cp=2 --sequences-per-step=8 --log-every=1000 \
  | tee "$tmp/replay.out" || fail "replay exited $? (want 0)"

"$python" - "$tmp/run/report.json" <<'PY' || fail "report.json does not say what it should"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["verdict"] == "pass" and r["exit_code"] == 0, r["verdict"]
by = {c["name"]: c for c in r["comparisons"]}
for name in ("independent", "resumed"):
    assert by[name]["verdict"] == "as_expected" and "first_difference" not in by[name], by[name]
assert by["independent"]["captures_compared"] == 4 * 4, by["independent"]
assert by["resumed"]["captures_compared"] == 2 * 4, by["resumed"]
want = {"broken-rng": "rng/caller/cpu", "broken-optimizer": "optimizer/",
        "broken-data": "data/position"}
for name, prefix in want.items():
    d = by[name]["first_difference"]
    assert d["step"] == 3, (name, d)
    assert d["path"].startswith(prefix), (name, d["path"])
    assert d["kind"] == "bytes" and d["byte_offset"] >= 0 and d["element_index"] >= 0, d
    print(f"{name}: step {d['step']} rank {d['rank']} {d['path']} byte {d['byte_offset']} "
          f"element {d['element_index']} ({d['a']} vs {d['b']})")
PY
# Python's generators are declared absent with their reason in every capture's index.
grep -q '"python_random"' "$tmp/run/reference/captures/step1/rank0/index.json" \
  || fail "the capture's index does not declare Python's random"
echo "PASS: the Python twin replays like the C++ example"
