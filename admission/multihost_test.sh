#!/usr/bin/env bash
# Jobs across hosts made of Linux namespaces (testing/netns/hosts.sh): two hosts of two ranks
# each, one launch per host (torchrun's multi-node numbering), over Gloo on the hosts' network.
#  - the job runs; the host lane connects within each host and never across them
#  - a node that never comes is named by the others' rendezvous, within its timeout
#  - a host killed mid-job (SIGKILL of its launch), a link cut mid-job, the store's host
#    unreachable at start-up: every surviving rank fails with an error within its timeout, no
#    launch hangs, no rank is left running
#  - a slow link (tbf: 1 Mbit/s, 50 ms queue) only makes the job slower, and so does a relay
#    on the store's connections that delays them 200 ms a chunk and then stalls them for 3 s
set -euo pipefail
source testing/netns/hosts.sh
hosts_require_root
launch=$PWD/tools/launch
probe=$PWD/admission/multihost_probe
ledger=$PWD/tools/ledger
# Not under /tmp: every host has a /tmp of its own.
tmp=${TEST_TMPDIR:-$(mktemp -d -p /var/tmp)}
port=29400
addr=10.77.0.1

start_node() {  # host node log probe-flags...
  local host=$1 node=$2 log=$3
  shift 3
  host_start "$host" "$log" "$launch" --nnodes=2 --node_rank="$node" --nproc="${NPROC:-2}" \
    --master_addr="$addr" --master_port="$port" --grace_seconds=2 --deadline_seconds=90 \
    -- "$probe" "$@"
}
# Waits for pid $1 at most $2 seconds; its exit code in $rc, 124 if it had to be killed.
wait_for() {
  local pid=$1 limit=$2 waited=0
  while kill -0 "$pid" 2>/dev/null && ((waited < limit * 10)); do sleep 0.1; waited=$((waited + 1)); done
  if kill -0 "$pid" 2>/dev/null; then
    host_kill_command "$pid"; kill -KILL "$pid"; wait "$pid" 2>/dev/null || true; rc=124; return
  fi
  set +e; wait "$pid"; rc=$?; set -e
}
expect() { grep -q -- "$2" "$1" || { echo "FAIL: no '$2' in $1:"; cat "$1"; exit 1; }; }
# The ledgers of ranks $3.. (in dir $2) all verify, and every rank that reported its error in
# the log ("probe error (rank R): ... (last committed step S)") replays to the step S it last
# committed; at least one did (a launch stops its node's other ranks once one fails, and a
# killed host's ranks say nothing).
check_ledgers() {  # log dir ranks...
  local log=$1 dir=$2 r s n=0
  shift 2
  for r in "$@"; do
    "$ledger" "$dir/ledger.rank$r.db" >"$dir/replay$r.log" || { cat "$dir/replay$r.log"; echo "FAIL: rank $r's ledger refused"; exit 1; }
    s=$(sed -n "s/.*probe error (rank $r): .*(last committed step \(-\?[0-9]*\))$/\1/p" "$log")
    [[ -z $s ]] && continue
    expect "$dir/replay$r.log" "dp rank $r: last committed step $s$"
    n=$((n + 1))
  done
  ((n > 0)) || { echo "FAIL: no rank of $* reported its error in $log"; exit 1; }
  echo "ledgers of ranks $*: verified; the $n that reported an error replay to the step they last committed"
}
until_setup() {  # log: waits until the node's two ranks are set up
  for _ in $(seq 300); do [[ $(grep -c "lane within node" "$1" || true) -ge 2 ]] && return; sleep 0.1; done
  echo "FAIL: $1 never set up:"; cat "$1"; exit 1
}

hosts_up 2
port=$((port + 1))

echo "== two hosts, two ranks each"
start_node 0 0 "$tmp/a0.log" --seconds=2; a0=$HOST_PID
start_node 1 1 "$tmp/a1.log" --seconds=2; a1=$HOST_PID
wait_for "$a0" 60; rc0=$rc; wait_for "$a1" 60; rc1=$rc
cat "$tmp/a0.log" "$tmp/a1.log"
[[ $rc0 == 0 && $rc1 == 0 ]] || { echo "FAIL: the launches exited $rc0 and $rc1"; exit 1; }
for r in 0 1; do expect "$tmp/a0.log" "rank $r on host0: lane within node: yes; lane across nodes: no"; done
for r in 2 3; do expect "$tmp/a1.log" "rank $r on host1: lane within node: yes; lane across nodes: no"; done
expect "$tmp/a1.log" "rank 3: ok after"
# The control: the same two nodes on one host do share memory across "nodes".
port=$((port + 1))
start_node 0 0 "$tmp/same0.log" --seconds=2; s0=$HOST_PID
start_node 0 1 "$tmp/same1.log" --seconds=2; s1=$HOST_PID
wait_for "$s0" 60; wait_for "$s1" 60
expect "$tmp/same1.log" "rank 2 on host0: lane within node: yes; lane across nodes: yes"
# The per-call cost of an all-reduce between two ranks, one per host and both on one host (one
# rank per node: four Gloo ranks would measure this machine's two cores, not the link).
port=$((port + 1))
NPROC=1 start_node 0 0 "$tmp/m0.log" --seconds=2; m0=$HOST_PID
NPROC=1 start_node 1 1 "$tmp/m1.log" --seconds=2; m1=$HOST_PID
wait_for "$m0" 60; wait_for "$m1" 60
port=$((port + 1))
NPROC=1 start_node 0 0 "$tmp/o0.log" --seconds=2; o0=$HOST_PID
NPROC=1 start_node 0 1 "$tmp/o1.log" --seconds=2; o1=$HOST_PID
wait_for "$o0" 60; wait_for "$o1" 60
expect "$tmp/m1.log" "rank 1: ok after"; expect "$tmp/o1.log" "rank 1: ok after"
echo "all-reduce of 8 KiB between 2 ranks: across two hosts $(grep -o 'median [0-9.]* us' "$tmp/m1.log");" \
  "on one host $(grep -o 'median [0-9.]* us' "$tmp/o1.log")"

echo "== a node that never comes"
port=$((port + 1))
start=$SECONDS
start_node 0 0 "$tmp/b0.log" --timeout_seconds=3; b0=$HOST_PID
wait_for "$b0" 30
cat "$tmp/b0.log"
[[ $rc != 0 && $rc != 124 ]] || { echo "FAIL: a lone node exited $rc"; exit 1; }
expect "$tmp/b0.log" "missing rank(s) 2, 3 (2 ranks per node, 2 nodes); node(s) 1 sent no rank"
echo "named the missing node in $((SECONDS - start)) s"

echo "== a host killed mid-job"
port=$((port + 1))
mkdir -p "$tmp/lc"
start_node 0 0 "$tmp/c0.log" --seconds=60 --timeout_seconds=5 --ledger_dir="$tmp/lc"; c0=$HOST_PID
start_node 1 1 "$tmp/c1.log" --seconds=60 --timeout_seconds=5 --ledger_dir="$tmp/lc"; c1=$HOST_PID
until_setup "$tmp/c0.log"; until_setup "$tmp/c1.log"
sleep 1  # steps committed
host_kill_command "$c1"; wait "$c1" 2>/dev/null || true
start=$SECONDS
wait_for "$c0" 40
cat "$tmp/c0.log"
[[ $rc != 0 && $rc != 124 ]] || { echo "FAIL: the surviving node exited $rc"; exit 1; }
expect "$tmp/c0.log" "probe error"
expect "$tmp/c0.log" "global rank(s) \[2, 3\] gone"
check_ledgers "$tmp/c0.log" "$tmp/lc" 0 1
# The killed host's ledgers: intact, a SIGKILL mid-step loses only that step's open work.
"$ledger" "$tmp/lc/ledger.rank2.db" "$tmp/lc/ledger.rank3.db" >"$tmp/lc/killed.log" \
  || { cat "$tmp/lc/killed.log"; echo "FAIL: a killed rank's ledger refused"; exit 1; }
echo "the surviving node failed $((SECONDS - start)) s after the kill"

echo "== a link cut mid-job"
port=$((port + 1))
mkdir -p "$tmp/ld"
start_node 0 0 "$tmp/d0.log" --seconds=60 --timeout_seconds=5 --ledger_dir="$tmp/ld"; d0=$HOST_PID
start_node 1 1 "$tmp/d1.log" --seconds=60 --timeout_seconds=5 --ledger_dir="$tmp/ld"; d1=$HOST_PID
until_setup "$tmp/d0.log"; until_setup "$tmp/d1.log"
host_link 1 down
start=$SECONDS
wait_for "$d0" 40; rc0=$rc; wait_for "$d1" 40; rc1=$rc
host_link 1 up
cat "$tmp/d0.log" "$tmp/d1.log"
[[ $rc0 != 0 && $rc0 != 124 && $rc1 != 0 && $rc1 != 124 ]] \
  || { echo "FAIL: after the cut the launches exited $rc0 and $rc1"; exit 1; }
expect "$tmp/d0.log" "probe error"; expect "$tmp/d1.log" "probe error"
expect "$tmp/d0.log" "global rank(s) \[2, 3\] gone"
grep -Eq "global rank\(s\) \[0, 1\] gone|store is unreachable for the roll call \(global rank 0" "$tmp/d1.log" \
  || { echo "FAIL: node 1 did not name node 0's ranks"; exit 1; }
check_ledgers "$tmp/d0.log" "$tmp/ld" 0 1; check_ledgers "$tmp/d1.log" "$tmp/ld" 2 3
# The bound: the collective's timeout (5 s), the roll call (at most one store timeout over a
# link that is down) and the launch's grace (2 s).
((SECONDS - start <= 20)) || { echo "FAIL: the sides took $((SECONDS - start)) s to fail"; exit 1; }
echo "both sides failed within $((SECONDS - start)) s of the cut"

echo "== the store's host unreachable at start-up"
port=$((port + 1))
host_link 0 down
start=$SECONDS
start_node 1 1 "$tmp/e1.log" --timeout_seconds=3; e1=$HOST_PID
wait_for "$e1" 40
host_link 0 up
cat "$tmp/e1.log"
[[ $rc != 0 && $rc != 124 ]] || { echo "FAIL: a node without its store exited $rc"; exit 1; }
expect "$tmp/e1.log" "joining the TCP store at $addr:$port"
echo "failed in $((SECONDS - start)) s without the store"

echo "== a slow link"
port=$((port + 1))
host_shape 1 1mbit 50ms
start=$SECONDS
start_node 0 0 "$tmp/f0.log" --seconds=3 --timeout_seconds=30; f0=$HOST_PID
start_node 1 1 "$tmp/f1.log" --seconds=3 --timeout_seconds=30; f1=$HOST_PID
wait_for "$f0" 90; rc0=$rc; wait_for "$f1" 90; rc1=$rc
cat "$tmp/f0.log"
[[ $rc0 == 0 && $rc1 == 0 ]] || { cat "$tmp/f1.log"; echo "FAIL: over the slow link the launches exited $rc0 and $rc1"; exit 1; }
echo "passed over the slow link in $((SECONDS - start)) s"

echo "== the store's connections through a relay that delays, then stalls, then passes"
host_unshape 1
port=$((port + 1))
ctl=$tmp/relay.ctl
echo pass >"$ctl"
# Node 1 reaches the store through the relay on its own address (testing/netns/relay.py).
# A copy outside /tmp: the source tree may be under /tmp, which the hosts do not see.
cp "$PWD/testing/netns/relay.py" "$tmp/relay.py"
host_start 1 "$tmp/relay.log" /usr/bin/python3 "$tmp/relay.py" \
  "10.77.0.2:$port" "$addr:$port" "$ctl"
relay=$HOST_PID
for _ in $(seq 200); do grep -q "relay: listening" "$tmp/relay.log" && break; sleep 0.1; done
expect "$tmp/relay.log" "relay: listening"
start=$SECONDS
start_node 0 0 "$tmp/g0.log" --seconds=10 --timeout_seconds=15; g0=$HOST_PID
sleep 2  # rank 0 serves the store before node 1 asks the relay for it
addr=10.77.0.2 start_node 1 1 "$tmp/g1.log" --seconds=10 --timeout_seconds=15; g1=$HOST_PID
until_setup "$tmp/g1.log"
echo "delay 200" >"$ctl"; sleep 2
echo pause >"$ctl"; sleep 3
echo pass >"$ctl"
wait_for "$g0" 90; rc0=$rc; wait_for "$g1" 90; rc1=$rc
cat "$tmp/g1.log" "$tmp/relay.log"
[[ $rc0 == 0 && $rc1 == 0 ]] || { cat "$tmp/g0.log"; echo "FAIL: through the relay the launches exited $rc0 and $rc1"; exit 1; }
expect "$tmp/relay.log" "relay: pause"
echo "passed through a delaying and stalling relay in $((SECONDS - start)) s"

echo "== the relay cut while node 1 joins through it"
kill -KILL "$relay" 2>/dev/null || true
port=$((port + 1))
echo pass >"$ctl"
host_start 1 "$tmp/relay2.log" /usr/bin/python3 "$tmp/relay.py" \
  "10.77.0.2:$port" "$addr:$port" "$ctl"
relay=$HOST_PID
for _ in $(seq 200); do grep -q "relay: listening" "$tmp/relay2.log" && break; sleep 0.1; done
start_node 0 0 "$tmp/h0.log" --timeout_seconds=8; h0=$HOST_PID
sleep 2
echo pause >"$ctl"
addr=10.77.0.2 start_node 1 1 "$tmp/h1.log" --timeout_seconds=8; h1=$HOST_PID
# Both of node 1's ranks connected to the store through the relay, their requests held.
for _ in $(seq 100); do
  (($(grep -c "relay: connection" "$tmp/relay2.log" || true) >= 2)) && break; sleep 0.1
done
echo cut >"$ctl"
start=$SECONDS
wait_for "$h1" 40; rc1=$rc; wait_for "$h0" 40; rc0=$rc
cat "$tmp/h0.log" "$tmp/h1.log" "$tmp/relay2.log"
[[ $rc0 != 0 && $rc0 != 124 && $rc1 != 0 && $rc1 != 124 ]] \
  || { echo "FAIL: after the relay's cut the launches exited $rc0 and $rc1"; exit 1; }
expect "$tmp/relay2.log" "relay: cut"
expect "$tmp/h1.log" "rendezvous at 10.77.0.2:$port"
expect "$tmp/h1.log" "the connection to the rendezvous store was lost"
expect "$tmp/h0.log" "node(s) 1 sent no rank"
echo "both sides failed within $((SECONDS - start)) s of the cut, node 1 naming the store's link"
kill -KILL "$relay" 2>/dev/null || true

hosts_down
left=$(ip netns list | grep -c "^$HOSTS_PREFIX-" || true)
[[ $left == 0 ]] || { echo "FAIL: $left namespaces left"; exit 1; }
echo "multihost test: ok"
