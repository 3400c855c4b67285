#!/usr/bin/env bash
# End to end: tools/launch starts 4 collectives_demo ranks (DP2 x CP2 over Gloo); every rank must
# report success, and a failing rank must make launch exit non-zero.
set -euo pipefail
launch=tools/launch
demo=tools/collectives_demo
out=$("$launch" --nproc 4 -- "$demo" --tp 1 --cp 2)
echo "$out"
for r in 0 1 2 3; do
  grep -q "^\[rank $r\] rank $r of DP2 x TP1 x CP2 .*TPxCP agreement ok" <<<"$out" \
    || { echo "rank $r did not report success"; exit 1; }
done
grep -q "^\[rank 3\] .*leaders TP 3, CP 2, TPxCP 2, DP 1 ok; DP all-gather \[1, 3\]" <<<"$out" \
  || { echo "rank 3's groups are wrong"; exit 1; }
# A topology that does not divide the world: every rank fails, launch must say so.
bad=$(mktemp "${TEST_TMPDIR:-/tmp}/launch_demo_bad.XXXXXX")
if "$launch" --nproc 2 -- "$demo" --cp 4 >"$bad" 2>&1; then
  echo "launch exited 0 although every rank failed"; exit 1
fi
grep -q "does not divide the world size 2" "$bad" || { cat "$bad"; exit 1; }
echo "launch demo: ok"
