#!/usr/bin/env bash
# qualify must pass on real topologies and fail under its negative control.
set -euo pipefail
qualify=tools/qualify
tmp=${TEST_TMPDIR:-$(mktemp -d)}

"$qualify" --dp 2 --tp 1 --cp 2 --out "$tmp/dp2cp2.json"
grep -q '"passed": true' "$tmp/dp2cp2.json" || { echo "evidence does not say passed"; exit 1; }
for check in replica_agreement dp_workers_independent model_stream exception_restoration partition_invariance checkpoint_recompute; do
  grep -q "\"name\": \"$check\"" "$tmp/dp2cp2.json" || { echo "evidence lacks $check"; exit 1; }
done

"$qualify" --dp 2 --tp 2 --cp 1 --out "$tmp/dp2tp2.json"

set +e
"$qualify" --dp 2 --tp 1 --cp 2 --negative-control no-sync --out "$tmp/nosync.json" >"$tmp/nosync.txt"
rc=$?
set -e
cat "$tmp/nosync.txt"
[[ $rc == 1 ]] || { echo "negative control no-sync exited $rc, expected 1"; exit 1; }
grep -q "^replica_agreement *FAIL" "$tmp/nosync.txt" || { echo "replica_agreement did not fail"; exit 1; }
grep -q '"passed": false' "$tmp/nosync.json"

set +e
"$qualify" --dp 2 --tp 1 --cp 2 --negative-control aliasing-snapshot --out "$tmp/alias.json" >"$tmp/alias.txt"
rc=$?
set -e
cat "$tmp/alias.txt"
[[ $rc == 1 ]] || { echo "negative control aliasing-snapshot exited $rc, expected 1"; exit 1; }
grep -q "^checkpoint_recompute *FAIL" "$tmp/alias.txt" || { echo "checkpoint_recompute did not fail"; exit 1; }
grep -q "^replica_agreement *PASS" "$tmp/alias.txt" || { echo "aliasing-snapshot broke more than recompute"; exit 1; }

# Bad flags are named.
if "$qualify" --dp 0 2>"$tmp/bad.txt"; then echo "--dp 0 accepted"; exit 1; fi
grep -q -- "--dp 0 is not a positive integer" "$tmp/bad.txt"
echo "qualify test: ok"
