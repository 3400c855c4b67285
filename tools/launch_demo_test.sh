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
# A TP x CP product that overflows 32 bits (once a division by zero): a clear error on every rank.
if "$launch" --nproc=2 -- "$demo" --tp=65536 --cp=65536 >"$bad" 2>&1; then
  echo "launch exited 0 for TP 65536 x CP 65536"; exit 1
fi
grep -q "TP size 65536 x CP size 65536" "$bad" || { cat "$bad"; exit 1; }

# A SIGKILLed launcher takes its ranks with it (PR_SET_PDEATHSIG): none may outlive it.
piddir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/launch_pids.XXXXXX")
"$launch" --nproc=2 -- /bin/sh -c "echo \$\$ > $piddir/\$RANK.tmp && mv $piddir/\$RANK.tmp $piddir/\$RANK; exec sleep 60" \
  >/dev/null 2>&1 &
launcher=$!
for _ in $(seq 200); do [[ -s $piddir/0 && -s $piddir/1 ]] && break; sleep 0.05; done
[[ -s $piddir/0 && -s $piddir/1 ]] || { echo "the ranks did not start"; exit 1; }
alive() {  # pid: running or stopped, not a zombie
  [[ -r /proc/$1/stat ]] && ! sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | grep -q '^[ZX]'
}
sleep 60 & bystander=$!  # the control: a process that is not a rank stays alive
kill -9 "$launcher"
for _ in $(seq 40); do
  alive "$(cat "$piddir/0")" || alive "$(cat "$piddir/1")" || break
  sleep 0.05
done
for r in 0 1; do
  if alive "$(cat "$piddir/$r")"; then echo "rank $r outlived its SIGKILLed launcher"; exit 1; fi
done
alive "$bystander" || { echo "the liveness check cannot see a live process"; exit 1; }
kill "$bystander"

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
# TP and CP sizes that cannot split the world, and a launch environment that cannot run, are bad
# input (exit 2) found before any rendezvous: a rank alone, whose store would never come, exits
# at once.
alone() { env MASTER_ADDR=127.0.0.1 MASTER_PORT=9 RANK=1 WORLD_SIZE=4 "$@"; }
expect_bad "does not divide" alone timeout 20 "$demo" --tp=3
expect_bad "TP size 0" alone timeout 20 "$demo" --tp=0
expect_bad "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2" alone LOCAL_RANK=2 LOCAL_WORLD_SIZE=2 timeout 20 "$demo"
# --help lists the flags and the logging settings.
"$launch" --help >"$bad" 2>&1 || true
grep -q "nproc" "$bad" && grep -q "GLOG_v" "$bad" || { cat "$bad"; exit 1; }
echo "launch demo: ok"
