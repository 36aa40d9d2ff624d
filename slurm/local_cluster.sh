#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for trying the batch scripts here and for the
# Slurm end-to-end test (tests/slurm/). Debian 12's slurm-wlm 22.05 and munge, no systemd, root.
#
#   slurm/local_cluster.sh start DIR   write DIR/slurm.conf, start munged (when none runs),
#                                      slurmctld and slurmd, wait until the node is idle
#   slurm/local_cluster.sh stop DIR    cancel DIR's jobs, stop the daemons started from DIR
#   slurm/local_cluster.sh env DIR     print the export line that points Slurm's commands at DIR
#
# Everything the cluster writes (state, spool, logs, pid files) stays under DIR. The ports are
# SLURM_LOCAL_PORT and the one after it (default 16817), so that it does not meet a real cluster's
# 6817/6818. Exit status 77 means "cannot run here" (not root, or Slurm or munge not installed),
# which the test reports as skipped.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: $0 start|stop|env DIR" >&2
  exit 2
fi

port=${SLURM_LOCAL_PORT:-16817}
conf="$dir/slurm.conf"

die() { echo "local_cluster: $*" >&2; exit 1; }
cannot() { echo "local_cluster: cannot run here: $*" >&2; exit 77; }

# Wait up to $1 seconds for the command after it to succeed.
wait_for() {
  local seconds=$1; shift
  local i
  for ((i = 0; i < seconds * 5; ++i)); do
    if "$@" > /dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  return 1
}

start() {
  [ "$(id -u)" = 0 ] || cannot "the daemons run as root here (SlurmUser=root); run as root"
  for b in slurmctld slurmd munged sinfo; do
    command -v "$b" > /dev/null || [ -x "/usr/sbin/$b" ] || cannot "'$b' not found (apt-get install slurm-wlm munge)"
  done
  [ -r /etc/munge/munge.key ] || cannot "/etc/munge/munge.key missing (the munge package creates it)"
  mkdir -p "$dir"/{state,spool,log}
  dir=$(cd "$dir" && pwd)
  conf="$dir/slurm.conf"

  # munged: one per machine, shared by every cluster on it; started as the munge user.
  if ! munge -n > /dev/null 2>&1; then
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged || die "munged did not start"
    wait_for 10 munge -n || die "munged started but 'munge -n' fails"
    touch "$dir/munged.ours"  # stop stops it again
  fi

  local host node_line
  host=$(hostname -s)
  # slurmd -C prints this machine's NodeName line (CPUs, sockets, cores, memory); keep its
  # hardware and drop the uptime line under it.
  node_line=$(/usr/sbin/slurmd -C | head -n 1)
  [[ "$node_line" == NodeName=* ]] || die "slurmd -C printed no NodeName line: $node_line"
  cat > "$conf" << EOF
# Written by slurm/local_cluster.sh: a one-node cluster in $dir.
ClusterName=seqrec-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobRequeue=1
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
# A requeued job may start again cred_expire + 1 s after it stopped; the backfill pass that
# starts it runs every second instead of every 30.
SchedulerParameters=bf_interval=1
SlurmctldTimeout=30
SlurmdTimeout=30
$node_line NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  export SLURM_CONF="$conf"
  # -c: a clean start, no jobs or state from an earlier cluster in the same folder.
  /usr/sbin/slurmctld -c -f "$conf" || die "slurmctld did not start: $(tail -n 5 "$dir/log/slurmctld.log" 2>/dev/null)"
  /usr/sbin/slurmd -f "$conf" || die "slurmd did not start: $(tail -n 5 "$dir/log/slurmd.log" 2>/dev/null)"
  if ! wait_for 30 bash -c "sinfo -h -N -o '%T' | grep -qx idle"; then
    die "the node did not come up idle within 30 s: $(sinfo -N 2>&1 | tail -n 2); logs in $dir/log"
  fi
  echo "local_cluster: up in $dir (node $host, ports $port-$((port + 1))); export SLURM_CONF=$conf"
}

stop() {
  local f pid
  # Jobs still running would outlive slurmd (their steps are not its children): cancel them first.
  if [ -r "$conf" ] && [ -r "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2> /dev/null; then
    SLURM_CONF="$conf" scancel --full --quiet --user="$(id -un)" 2> /dev/null || true
    wait_for 15 bash -c "[ -z \"\$(SLURM_CONF='$conf' squeue -h -t RUNNING,COMPLETING 2> /dev/null)\" ]" || true
  fi
  for f in slurmd slurmctld; do
    [ -r "$dir/$f.pid" ] || continue
    pid=$(cat "$dir/$f.pid")
    if kill -0 "$pid" 2> /dev/null; then
      kill "$pid" 2> /dev/null || true
      wait_for 10 bash -c "! kill -0 $pid" || kill -9 "$pid" 2> /dev/null || true
    fi
    rm -f "$dir/$f.pid"
  done
  if [ -e "$dir/munged.ours" ] && [ -r /run/munge/munged.pid ]; then
    kill "$(cat /run/munge/munged.pid)" 2> /dev/null || true
    rm -f "$dir/munged.ours"
  fi
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  env) echo "export SLURM_CONF=$(cd "$dir" && pwd)/slurm.conf" ;;
  *) echo "usage: $0 start|stop|env DIR" >&2; exit 2 ;;
esac
