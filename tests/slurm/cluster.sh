#!/usr/bin/env bash
# A real Slurm on this machine for the tests: a private munged, a slurmctld and two slurmd
# emulating nodes n1 and n2 on loopback (Debian's slurm-wlm; docs/slurm.md). Everything
# lives in one private directory: the configuration, the munge key and socket, the state,
# the logs and the pid files. Ports are picked free on this machine, so it can run beside
# other tests (and beside a system Slurm or munge, which it never touches).
#
#   tests/slurm/cluster.sh start DIR [--owner PID] [--memory]
#                                                    start; prints `export SLURM_CONF=…`
#   tests/slurm/cluster.sh stop DIR                  cancel its jobs, stop its daemons
#   tests/slurm/cluster.sh run DIR -- COMMAND…       start, run COMMAND, stop (a trap)
#
# `--owner PID`: a watchdog stops the cluster when process PID ends, so a test that is
# killed (a ctest timeout) leaves no daemons behind. `--memory`: memory is a consumable
# resource and task/cgroup confines each job to its `--mem` (ConstrainRAMSpace), as sites
# that enforce memory limits run Slurm; a machine whose cgroups slurmd cannot use skips. Stop acts on exactly the daemons whose
# pid files are in DIR, and on the slurmstepd processes that hold DIR's log files open.
#
# Exit codes: 0 done; 77 cannot run here (not root, or the Slurm packages are missing and
# cannot be installed) with the reason on stderr; anything else: a real failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
self="$root/tests/slurm/cluster.sh"

skip() {
  echo "cluster.sh: SKIP: $*" >&2
  exit 77
}
fail() {
  echo "cluster.sh: $*" >&2
  exit 1
}

# Three free TCP ports in 20000-32767 (below Linux's ephemeral range, so no outgoing
# connection holds them), none listening now on any address.
free_ports() {
  local listening="" start p hex
  # Column 2 is ADDRESS:PORT in hex, column 4 the state (0A: listening).
  while read -r hex; do
    listening+="$((16#$hex))"$'\n'
  done < <(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null |
    awk '$4 == "0A" { sub(/.*:/, "", $2); print $2 }')
  for _ in $(seq 50); do
    start=$((20000 + (RANDOM * 32768 + RANDOM) % 12000))
    for p in $start $((start + 1)) $((start + 2)); do
      grep -qx "$p" <<<"$listening" && continue 2
    done
    echo "$start $((start + 1)) $((start + 2))"
    return 0
  done
  fail "no free ports found"
}

have_slurm() {
  command -v munged >/dev/null && command -v slurmctld >/dev/null &&
    command -v slurmd >/dev/null && command -v sbatch >/dev/null
}

# Waits up to $1 seconds for `$2…` to succeed.
wait_for() {
  local limit=$1
  shift
  for _ in $(seq $((limit * 5))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}

no_jobs() {
  [[ -z $(squeue -h 2>/dev/null) ]]
}

nodes_idle() {
  [[ $(sinfo -h -N -o '%N %t' | sort) == $'n1 idle\nn2 idle' ]]
}

start() {
  local dir=$1 owner=${2:-} memory=${3:-}
  [[ $(id -u) -eq 0 ]] || skip "needs root: munged, slurmctld and slurmd run as root (SlurmUser=root) to start jobs"
  if ! have_slurm; then
    echo "cluster.sh: Slurm or munge missing; running scripts/install-deps.sh" >&2
    local out
    out=$("$root/scripts/install-deps.sh" 2>&1) ||
      skip "the Slurm packages are not installed and could not be installed (scripts/install-deps.sh: $(tail -n 3 <<<"$out" | tr '\n' ' '))"
    have_slurm || skip "slurm-wlm/munge still missing after scripts/install-deps.sh"
  fi
  [[ -e "$dir/slurm.conf" ]] && fail "$dir already holds a cluster; stop it first"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  chmod 0700 "$dir"
  mkdir -p "$dir"/{state,spool,log,munge} "$dir"/tmp/{n1,n2}
  chmod 0700 "$dir/munge"
  # Whatever started is stopped again if the start fails half-way.
  trap 'stop "$dir" >/dev/null 2>&1' EXIT

  # munge: its own key and socket. munged refuses a key others can read.
  local sock="$dir/munge/munge.socket"
  head -c 1024 /dev/urandom >"$dir/munge/munge.key"
  chmod 0400 "$dir/munge/munge.key"
  munged --force --socket="$sock" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed" 2>>"$dir/log/munged.log" ||
    fail "munged did not start: $(tail -n 5 "$dir/log/munged.log")"

  local ports host cpus task=task/none select=CR_Core
  read -r -a ports <<<"$(free_ports)"
  if [[ -n $memory ]]; then
    task=task/cgroup
    select=CR_Core_Memory
    printf 'ConstrainRAMSpace=yes\nConstrainSwapSpace=yes\n' >"$dir/cgroup.conf"
  fi
  host=$(hostname)
  # Two CPUs per emulated node (what a 2-core CI machine has); config_overrides keeps slurmd
  # from draining a node whose hardware differs from these numbers.
  cpus=2
  # cred_expire: a requeued job waits this long before it runs again (default 120 s).
  cat >"$dir/slurm.conf" <<EOF
ClusterName=difftrain-test
SlurmctldHost=$host(127.0.0.1)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock,cred_expire=10
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
TmpFS=$dir/tmp/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldPort=${ports[0]}
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=$task
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.log
SelectType=select/cons_tres
SelectTypeParameters=$select
MpiDefault=none
ReturnToService=2
KillWait=10
MinJobAge=600
InactiveLimit=0
SchedulerParameters=sched_interval=2
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=${ports[1]} CPUs=$cpus RealMemory=2000 State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=${ports[2]} CPUs=$cpus RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
EOF
  cat >"$dir/env" <<EOF
export SLURM_CONF=$dir/slurm.conf
EOF
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -i || fail "slurmctld did not start: $(tail -n 5 "$dir/log/slurmctld.log")"
  for n in n1 n2; do
    if ! slurmd -N "$n"; then
      [[ -n $memory ]] &&
        skip "slurmd with task/cgroup does not start on this machine: $(tail -n 3 "$dir/log/slurmd-$n.log" | tr '\n' ' ')"
      fail "slurmd -N $n did not start: $(tail -n 5 "$dir/log/slurmd-$n.log")"
    fi
  done
  if [[ -n $owner ]]; then
    # The watchdog: stops the cluster when the owner ends without stopping it.
    setsid "$self" watch "$dir" "$owner" </dev/null >>"$dir/log/watchdog.log" 2>&1 &
    echo $! >"$dir/watchdog.pid"
  fi
  if ! wait_for 30 nodes_idle; then
    local state
    state=$(sinfo -N 2>&1 || true)
    fail "the nodes did not become idle within 30 s: $state"
  fi
  trap - EXIT
  echo "export SLURM_CONF=$dir/slurm.conf"
}

# Prints the pid in pid file $1 if that process is alive and runs program $2.
live_pid() {
  local pid
  [[ -s $1 ]] || return 1
  pid=$(<"$1")
  [[ $pid =~ ^[0-9]+$ && $(readlink "/proc/$pid/exe" 2>/dev/null) == */"$2"* ]] || return 1
  echo "$pid"
}

# The slurmstepd processes of this cluster: they hold its slurmd log files open.
stepds() {
  local dir=$1 p fd
  for p in /proc/[0-9]*; do
    [[ $(readlink "$p/exe" 2>/dev/null) == */slurmstepd* ]] || continue
    for fd in "$p"/fd/*; do
      if [[ $(readlink "$fd" 2>/dev/null) == "$dir/log/"* ]]; then
        echo "${p#/proc/}"
        break
      fi
    done
  done
}

stop() {
  local dir
  dir=$(cd "$1" && pwd)
  [[ -e "$dir/slurm.conf" ]] || return 0
  export SLURM_CONF="$dir/slurm.conf"
  touch "$dir/stopping"
  # Jobs first, while slurmctld and the slurmd can still end them cleanly.
  if live_pid "$dir/slurmctld.pid" slurmctld >/dev/null; then
    scancel --quiet --full --signal=KILL --state=RUNNING --user=root 2>/dev/null || true
    scancel --quiet --user=root 2>/dev/null || true
    wait_for 20 no_jobs || true
  fi
  local pids=() pid f
  for f in "$dir"/slurmd-n1.pid:slurmd "$dir"/slurmd-n2.pid:slurmd \
    "$dir"/slurmctld.pid:slurmctld "$dir"/munge/munged.pid:munged; do
    pid=$(live_pid "${f%:*}" "${f##*:}") && pids+=("$pid")
  done
  for pid in $(stepds "$dir"); do pids+=("$pid"); done
  ((${#pids[@]} == 0)) && return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for pid in "${pids[@]}"; do
    wait_for 10 bash -c "! kill -0 $pid" || kill -KILL "$pid" 2>/dev/null || true
  done
  for pid in $(stepds "$dir"); do kill -KILL "$pid" 2>/dev/null || true; done
}

watch() {
  local dir=$1 owner=$2
  while kill -0 "$owner" 2>/dev/null && [[ -e "$dir/slurm.conf" && ! -e "$dir/stopping" ]]; do
    sleep 1
  done
  if [[ -e "$dir/slurm.conf" && ! -e "$dir/stopping" ]]; then
    echo "owner $owner ended without stopping the cluster: stopping it"
    stop "$dir"
  fi
}

case "${1:-}" in
  start)
    [[ $# -ge 2 ]] || fail "usage: cluster.sh start DIR [--owner PID] [--memory]"
    dir=$2 owner="" memory=""
    shift 2
    while [[ $# -gt 0 ]]; do
      case $1 in
        --owner) owner=${2:?--owner needs a pid} && shift 2 ;;
        --memory) memory=1 && shift ;;
        *) fail "unknown option $1" ;;
      esac
    done
    start "$dir" "$owner" "$memory"
    ;;
  stop)
    [[ $# -eq 2 ]] || fail "usage: cluster.sh stop DIR"
    stop "$2"
    ;;
  watch) watch "$2" "$3" ;;
  run)
    [[ $# -ge 4 && $3 == -- ]] || fail "usage: cluster.sh run DIR -- COMMAND..."
    dir=$2
    shift 3
    start "$dir" "" >/dev/null
    trap 'stop "$dir"' EXIT
    SLURM_CONF="$(cd "$dir" && pwd)/slurm.conf"
    export SLURM_CONF
    "$@"
    ;;
  *) fail "usage: cluster.sh start DIR [--owner PID] [--memory] | stop DIR | run DIR -- COMMAND..." ;;
esac
