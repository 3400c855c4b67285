#!/usr/bin/env bash
# tools/ledger on real ledgers: a two-rank probe job (admission/multihost_probe) records each
# all-reduce round as a committed step; ledger verifies both files and reports the last committed
# step the probe printed. Then the same files damaged: a row edited, the file truncated, a file
# missing — each refused with exit 1 naming the file; no file at all is exit 2.
set -euo pipefail
ledger=$PWD/tools/ledger
tmp=${TEST_TMPDIR:-$(mktemp -d)}
mkdir -p "$tmp/ledgers"
fail() { echo "FAIL: $*"; exit 1; }
tools/launch --nproc=2 -- admission/multihost_probe --seconds=1 \
  --ledger_dir="$tmp/ledgers" >"$tmp/job.log" 2>&1 || { cat "$tmp/job.log"; fail "the job failed"; }
rounds=$(sed -n 's/^\[rank 0\] rank 0: ok after \([0-9]*\) all-reduces .*/\1/p' "$tmp/job.log")
[[ -n $rounds && $rounds -gt 0 ]] || { cat "$tmp/job.log"; fail "no round count"; }
last=$((rounds - 1))

"$ledger" "$tmp/ledgers/ledger.rank0.db" "$tmp/ledgers/ledger.rank1.db" --out="$tmp/l.json" \
  >"$tmp/good.log" || { cat "$tmp/good.log"; fail "intact ledgers refused"; }
grep -v "^step " "$tmp/good.log"
for r in 0 1; do
  grep -q "ledger.rank$r.db: verified, $rounds steps" "$tmp/good.log" || fail "rank $r not verified"
  grep -q "dp rank $r: last committed step $last$" "$tmp/good.log" || fail "rank $r's last step"
done
/usr/bin/python3 - "$tmp/l.json" "$last" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))
assert [f["verified"] for f in e["files"]] == [True, True], e
assert e["files"][1]["last_committed_step"] == {"1": int(sys.argv[2])}, e["files"][1]
assert all(s["committed"] for f in e["files"] for s in f["steps"])
PY

# One event's kind edited in place (the bytes of the file, as a disk or a hand could): SQLite
# reads it fine; the event chain does not match.
cp "$tmp/ledgers/ledger.rank1.db" "$tmp/edited.db"
/usr/bin/python3 -c '
import sys
data = open(sys.argv[1], "rb").read()
at = data.rindex(b"completed")
open(sys.argv[1], "wb").write(data[:at] + b"c0mpleted" + data[at + 9:])' "$tmp/edited.db"
set +e; "$ledger" "$tmp/edited.db" >"$tmp/edited.log"; rc=$?; set -e
cat "$tmp/edited.log"
[[ $rc == 1 ]] || fail "an edited ledger: exit $rc, expected 1"
grep -q "edited.db: REFUSED (DATA_LOSS)" "$tmp/edited.log" || fail "the edit not named"

# Truncated to its first page.
head -c 4096 "$tmp/ledgers/ledger.rank0.db" >"$tmp/short.db"
set +e; "$ledger" "$tmp/short.db" "$tmp/absent.db" >"$tmp/short.log"; rc=$?; set -e
cat "$tmp/short.log"
[[ $rc == 1 ]] || fail "a truncated ledger: exit $rc, expected 1"
grep -q "short.db: REFUSED (DATA_LOSS)" "$tmp/short.log" || fail "the truncation not named"
grep -q "absent.db: REFUSED (NOT_FOUND)" "$tmp/short.log" || fail "the missing file not named"

set +e; "$ledger" >"$tmp/none.log" 2>&1; rc=$?; set -e
[[ $rc == 2 ]] || fail "no file: exit $rc, expected 2"
echo "ledger tool test: ok ($rounds rounds)"
