# testing/netns/hosts.sh — hosts made of Linux namespaces, for tests of jobs across machines.
# Source it from a bash test (set -euo pipefail), then:
#
#   hosts_require_root            where namespaces cannot be made: prints "NOT RUN: <why>" and
#                                 exits 0 (the not-run convention, docs/building.md), or, where
#                                 LOCKSTEP_REQUIRE_NETNS=1 (.ci/run sets it when it runs as
#                                 root), says why and exits 1: there the test must run
#   hosts_up N                    makes hosts 0..N-1: each its own network namespace with eth0 at
#                                 10.77.0.(K+1)/24 on a bridge in a switch namespace of its own
#   host_run K CMD...             runs CMD on host K: in its network namespace and in the IPC,
#                                 PID, UTS and mount namespaces (private /dev/shm and /tmp, host
#                                 name "hostK") that every process of host K shares
#   host_start K LOG CMD...       host_run in the background, output to LOG; sets HOST_PID (the
#                                 process that waits for CMD; host_kill_command kills CMD itself)
#   host_kill_command PID         SIGKILL to the command a host_start started (PID: its HOST_PID)
#   host_link K up|down           sets host K's link on the switch up or down
#   host_shape K RATE LATENCY     limits host K's egress with tc's token bucket (tbf)
#   host_unshape K                removes that limit
#   hosts_down                    kills everything in the hosts (each host's PID namespace ends
#                                 with its first process), removes every namespace and link it
#                                 made (also run on exit, failure included)
#
# Only the namespaces made here are ever addressed: every command runs inside them by name, and
# the addresses exist only inside them; nothing in the caller's network namespace changes.

PATH="$PATH:/usr/sbin:/sbin"  # ip, tc (a test environment may leave them out)
HOSTS_PREFIX="lockstep-$$-$RANDOM"
HOSTS_COUNT=0
HOSTS_PIDS=()
HOSTS_INITS=()  # per host: the first process of its PID namespace, as the caller sees it

hosts_require_root() {
  local why=""
  if [[ $(id -u) != 0 ]] || ! command -v ip >/dev/null || ! command -v unshare >/dev/null; then
    why="this test makes network namespaces and needs root with iproute2 and unshare"
  elif ! ip netns add "$HOSTS_PREFIX-probe" 2>/dev/null; then
    why="this machine refuses to make network namespaces (ip netns add failed)"
  else
    ip netns del "$HOSTS_PREFIX-probe"
    return 0
  fi
  if [[ ${LOCKSTEP_REQUIRE_NETNS:-0} == 1 ]]; then
    echo "FAILED: $why; LOCKSTEP_REQUIRE_NETNS=1 says this machine must run it"
    exit 1
  fi
  echo "NOT RUN: $why"
  exit 0
}

hosts_down() {
  local pid ns
  for pid in "${HOSTS_INITS[@]}" "${HOSTS_PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${HOSTS_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  HOSTS_PIDS=()
  HOSTS_INITS=()
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$HOSTS_PREFIX-" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
}

hosts_up() {
  local n=$1 k
  trap hosts_down EXIT
  ip netns add "$HOSTS_PREFIX-switch"
  ip -n "$HOSTS_PREFIX-switch" link add br0 type bridge
  ip -n "$HOSTS_PREFIX-switch" link set br0 up
  for ((k = 0; k < n; k++)); do
    local ns="$HOSTS_PREFIX-host$k"
    ip netns add "$ns"
    ip -n "$ns" link add eth0 type veth peer name port$k netns "$HOSTS_PREFIX-switch"
    ip -n "$ns" addr add "10.77.0.$((k + 1))/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip -n "$HOSTS_PREFIX-switch" link set port$k master br0
    ip -n "$HOSTS_PREFIX-switch" link set port$k up
    # The host's other namespaces, held by a first process that only sleeps.
    ip netns exec "$ns" unshare --ipc --pid --uts --mount --fork --mount-proc --propagation private \
      /bin/bash -c 'mount -t tmpfs tmpfs /dev/shm && mount -t tmpfs tmpfs /tmp &&
                    hostname "host'"$k"'" && exec sleep infinity' &
    local unshare_pid=$! init=""
    for _ in $(seq 100); do
      init=$(pgrep -P "$unshare_pid" || true)
      [[ -n $init && $(readlink "/proc/$init/ns/uts") != $(readlink /proc/self/ns/uts) &&
         $(cat "/proc/$init/comm" 2>/dev/null) == sleep ]] && break
      sleep 0.05
    done
    [[ -n $init ]] || { echo "hosts: host $k did not start"; return 1; }
    HOSTS_INITS+=("$init")
    HOSTS_PIDS+=("$unshare_pid")
  done
  HOSTS_COUNT=$n
}

host_addr() { echo "10.77.0.$(($1 + 1))"; }

host_run() {
  local k=$1
  shift
  nsenter --target "${HOSTS_INITS[$k]}" --net --ipc --uts --mount --pid -- env -u TEST_TMPDIR "$@"
}

host_start() {
  local k=$1 log=$2
  shift 2
  # exec: $! is nsenter itself, whose one child (it forks to enter the PID namespace) is CMD.
  (exec nsenter --target "${HOSTS_INITS[$k]}" --net --ipc --uts --mount --pid -- \
    env -u TEST_TMPDIR "$@") >"$log" 2>&1 &
  HOST_PID=$!
  HOSTS_PIDS+=("$HOST_PID")
}

host_kill_command() {
  pkill -KILL -P "$1" || true
}

host_link() {
  ip -n "$HOSTS_PREFIX-switch" link set "port$1" "$2"
}

host_shape() {
  ip netns exec "$HOSTS_PREFIX-host$1" tc qdisc replace dev eth0 root tbf rate "$2" burst 32kbit \
    latency "$3"
}

host_unshape() {
  ip netns exec "$HOSTS_PREFIX-host$1" tc qdisc del dev eth0 root
}
