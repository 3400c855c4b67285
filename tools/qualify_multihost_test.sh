#!/usr/bin/env bash
# qualify across two hosts made of namespaces (testing/netns/hosts.sh): DP2 x CP2, one qualify
# per host with two ranks each. Node 0 prints the table and writes evidence naming every rank's
# host; node 1 says how its ranks ended. Then node 1 killed mid-run, and node 1's link set down
# mid-run: the surviving side(s) fail, naming the other's ranks, within their timeouts.
set -euo pipefail
source testing/netns/hosts.sh
hosts_require_root
qualify=$PWD/tools/qualify
# Not under /tmp: every host has a /tmp of its own.
tmp=${TEST_TMPDIR:-$(mktemp -d -p /var/tmp)}
hosts_up 2
node() {  # host port log extra-flags...
  local k=$1 port=$2 log=$3
  shift 3
  host_start "$k" "$log" "$qualify" --dp=2 --tp=1 --cp=2 --nnodes=2 --node_rank="$k" \
    --master_addr=10.77.0.1 --master_port="$port" "$@"
}
rc_of() { set +e; wait "$1"; rc=$?; set -e; }
# Waits until host K's workers (run with GLOG_v=1) have logged PATTERN, so that a fault lands
# at a known point of the run rather than after a guessed sleep: qualify can finish in a few
# seconds on a fast machine. The working directory is in the host's own /tmp.
await_worker_log() {  # host node-log pattern
  local k=$1 log=$2 pattern=$3 dir
  for _ in $(seq 600); do
    dir=$(sed -n 's/^working directory: \([^ ]*\) .*/\1/p' "$log")
    if [[ -n $dir ]] && host_run "$k" grep -q "$pattern" "$dir/workers.log" 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  echo "FAIL: host $k's workers never logged '$pattern'"; cat "$log"; exit 1
}

start=$SECONDS
# The evidence goes to node 0's private /tmp: print it from there.
node 0 29600 "$tmp/n0.log" --out=/tmp/evidence.json; n0=$HOST_PID
node 1 29600 "$tmp/n1.log"; n1=$HOST_PID
rc_of "$n0"; rc0=$rc; rc_of "$n1"; rc1=$rc
cat "$tmp/n0.log" "$tmp/n1.log"
[[ $rc0 == 0 && $rc1 == 0 ]] || { echo "FAIL: the nodes' qualify exited $rc0 and $rc1"; exit 1; }
grep -q "^PASS: DP2 x TP1 x CP2" "$tmp/n0.log" || { echo "FAIL: node 0 did not pass"; exit 1; }
grep -q "this is node 1, ranks 2..3" "$tmp/n1.log" || { echo "FAIL: node 1 did not say its ranks"; exit 1; }
grep -q "the table, the verdict and the evidence are node 0's" "$tmp/n1.log" || exit 1
# Every one of the 16 checks qualify expects at CP 2 (qualification::ExpectedChecks).
for check in replica_agreement dp_workers_independent model_stream exception_restoration partition_invariance checkpoint_recompute oom_recovery replica_outputs caller_draws stream_progression reference_match resume empty_cp_shard repeatability actors packing_invariance; do
  grep -q "^$check *PASS *4/4" "$tmp/n0.log" || { echo "FAIL: $check did not pass on 4 ranks"; exit 1; }
done
host_run 0 /usr/bin/python3 -c '
import json, sys
e = json.load(open("/tmp/evidence.json"))
assert e["hosts"] == ["host0", "host0", "host1", "host1"], e["hosts"]
assert e["topology"]["nnodes"] == 2 and e["passed"], e["topology"]
print("evidence: hosts", e["hosts"])'
echo "qualify across two hosts passed in $((SECONDS - start)) s"

# Node 1 killed while the checks run: after its ranks passed oom_recovery, before the trainer's
# and the variability checks (the longer part of the run).
export GLOG_v=1
node 0 29610 "$tmp/k0.log" --timeout_seconds=10; k0=$HOST_PID
node 1 29610 "$tmp/k1.log" --timeout_seconds=10; k1=$HOST_PID
await_worker_log 1 "$tmp/k1.log" "oom_recovery PASS"
host_kill_command "$k1"
start=$SECONDS
rc_of "$k0"
cat "$tmp/k0.log"
[[ $rc == 1 ]] || { echo "FAIL: node 0 exited $rc after node 1 was killed, expected 1"; exit 1; }
grep -q "^FAIL: DP2 x TP1 x CP2" "$tmp/k0.log" || { echo "FAIL: node 0 did not fail"; exit 1; }
# The fault lands in the main round (a rank's collective names the ranks gone, or their reports
# never came) or in the second actor's (its rendezvous names the ranks missing).
grep -Eq "rank [23] wrote no report|rank\(s\) \[[23](, [23])?\] gone|missing rank\(s\) [23]" "$tmp/k0.log" \
  || { echo "FAIL: node 0 did not name the lost ranks"; exit 1; }
echo "node 0 failed $((SECONDS - start)) s after node 1 was killed"
# Node 1's link set down while the checks run: both nodes fail, each naming the other's ranks
# (or, on node 1, the store it can no longer reach), within their timeouts.
node 0 29620 "$tmp/l0.log" --timeout_seconds=10; l0=$HOST_PID
node 1 29620 "$tmp/l1.log" --timeout_seconds=10; l1=$HOST_PID
await_worker_log 1 "$tmp/l1.log" "oom_recovery PASS"
host_link 1 down
start=$SECONDS
rc_of "$l0"; rc0=$rc; t0=$((SECONDS - start))
rc_of "$l1"; rc1=$rc; t1=$((SECONDS - start))
host_link 1 up
cat "$tmp/l0.log" "$tmp/l1.log"
[[ $rc0 == 1 && $rc1 == 1 ]] || { echo "FAIL: with node 1's link down the nodes exited $rc0 and $rc1"; exit 1; }
grep -q "^FAIL: DP2 x TP1 x CP2" "$tmp/l0.log" || { echo "FAIL: node 0 did not fail"; exit 1; }
grep -Eq "rank [23] wrote no report|rank\(s\) \[[23](, [23])?\] gone|missing rank\(s\) [23]" "$tmp/l0.log" \
  || { echo "FAIL: node 0 did not name node 1's ranks"; exit 1; }
grep -Eq "^error: .*(rank\(s\) \[[01](, [01])?\] gone|store is unreachable|rendezvous store was lost|TCP store at 10.77.0.1)" "$tmp/l1.log" \
  || { echo "FAIL: node 1 did not name node 0's ranks or the store"; exit 1; }
# The bound, with the timeout of 10 s: the collective's timeout (or, when the link goes down
# while a group is being created, the store's wait inside Gloo's connection and then Gloo's
# own), the roll call (at most one store timeout over a link that is down), and on a loaded
# machine up to one more before the rank's exit, plus the launch's grace. A hang would run into
# the job deadline (90 s).
((t0 <= 55 && t1 <= 55)) || { echo "FAIL: the nodes took $t0 s and $t1 s to fail"; exit 1; }
echo "with node 1's link down, node 0 failed in $t0 s and node 1 in $t1 s"
hosts_down
echo "qualify multihost test: ok"
