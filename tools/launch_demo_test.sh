#!/usr/bin/env bash
# End to end: tools/launch starts 4 collectives_demo ranks (DP2 x CP2 over Gloo); every rank must
# report success, and a failing rank must make launch exit non-zero.
set -euo pipefail
launch=tools/launch
demo=tools/collectives_demo
out=$("$launch" --nproc=4 -- "$demo" --tp=1 --cp=2)
echo "$out"
for r in 0 1 2 3; do
  grep -q "^\[rank $r\] rank $r of DP2 x TP1 x CP2 .*TPxCP agreement ok" <<<"$out" \
    || { echo "rank $r did not report success"; exit 1; }
done
grep -q "^\[rank 3\] .*leaders TP 3, CP 2, TPxCP 2, DP 1 ok; DP all-gather \[1, 3\]" <<<"$out" \
  || { echo "rank 3's groups are wrong"; exit 1; }
# A topology that does not divide the world: every rank fails, launch must say so.
bad=$(mktemp "${TEST_TMPDIR:-/tmp}/launch_demo_bad.XXXXXX")
if "$launch" --nproc=2 -- "$demo" --cp=4 >"$bad" 2>&1; then
  echo "launch exited 0 although every rank failed"; exit 1
fi
grep -q "does not divide the world size 2" "$bad" || { cat "$bad"; exit 1; }

# Flags: bad values and unknown flags are named, exit 2, and start nothing.
expect_bad() {  # expected-message command...
  local want=$1
  shift
  set +e
  "$@" >"$bad" 2>&1
  local rc=$?
  set -e
  [[ $rc == 2 ]] || { echo "$* exited $rc, expected 2"; cat "$bad"; exit 1; }
  grep -q -- "$want" "$bad" || { echo "$*: no '$want' in:"; cat "$bad"; exit 1; }
}
expect_bad "--nproc 0 is not an integer in \[1, 1024\]" "$launch" --nproc=0 -- true
expect_bad "--nproc 5000 is not an integer" "$launch" --nproc=5000 -- true
expect_bad "--master_addr is empty" "$launch" --master_addr= -- true
expect_bad "bogus" "$launch" --bogus=1 -- true
expect_bad "nproc" "$launch" --nproc=abc -- true
expect_bad "no program given" "$launch" --nproc=2
expect_bad "unexpected argument extra" "$demo" extra
# --help lists the flags and the logging settings.
"$launch" --help >"$bad" 2>&1 || true
grep -q "nproc" "$bad" && grep -q "GLOG_v" "$bad" || { cat "$bad"; exit 1; }
echo "launch demo: ok"
