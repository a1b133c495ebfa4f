#!/usr/bin/env bash
# A small Slurm cluster on this one machine, for the tests (Debian's slurm-wlm and munge).
#
#   bash tests/ecosystem/slurm_up.sh up DIR [PARTITION ...]   # configure, start, wait until idle
#   bash tests/ecosystem/slurm_up.sh down DIR                 # stop what `up` started in DIR
#
# Everything lives in DIR (slurm.conf, gres.conf, state, logs, pid files); /etc/slurm is not touched,
# so clients need SLURM_CONF=DIR/slurm.conf (printed as the last line of `up`). Needs root.
#
# Nodes, all with this host's CPUs and memory and 8 GPUs (gres.conf, see below):
#   <host>         a real slurmd (port 6818)
#   vnode1         a second real slurmd on this host (port 6819), so multi-node jobs really run
#                  (2 nodes: `sbatch -N 2 -w <host>,vnode1`) and srun gives each node its own rank
#   vnode[2-N]     configuration only (N = VNODES, default 256): slurmctld's pings reach the first
#                  slurmd, so they show as idle and `sbatch --test-only` can check requests for up to
#                  N nodes. Nothing may run on them: real jobs name their nodes with -w.
# Partitions: `debug` (default) plus every PARTITION given (e.g. those the generated sbatches ask
# for); each holds every node, no time limit.
set -euo pipefail

usage() { sed -n '2,19p' "$0" >&2; exit 2; }
[[ $# -ge 2 ]] || usage
ACTION="$1"
mkdir -p "$2"
DIR="$(cd "$2" && pwd)"
shift 2
VNODES="${VNODES:-256}"
log() { printf '[slurm_up] %s\n' "$*" >&2; }

stop_pidfile() {
  local pidfile="$1" pid
  [[ -f "$pidfile" ]] || return 0
  pid="$(cat "$pidfile")"
  if [[ -n "$pid" ]] && kill "$pid" 2>/dev/null; then
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

stop() {
  local f
  for f in "$DIR"/slurmd-*.pid "$DIR/slurmctld.pid" "$DIR/munged.started"; do
    [[ -e "$f" ]] && stop_pidfile "$f"
  done
  return 0
}

case "$ACTION" in
  down) stop; exit 0 ;;
  up) ;;
  *) usage ;;
esac

[[ "$(id -u)" == "0" ]] || { echo "slurm_up.sh: needs root (slurmd runs jobs as their user)" >&2; exit 1; }
for tool in munge munged slurmctld slurmd sinfo; do
  command -v "$tool" >/dev/null 2>&1 || { echo "slurm_up.sh: $tool not found (apt-get install slurm-wlm munge)" >&2; exit 1; }
done
stop

# --- munge: the authentication every Slurm daemon and client uses ---------------------------------
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating /etc/munge/munge.key"
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
  log "starting munged"
  runuser -u munge -- munged
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  pgrep -u munge -x -n munged > "$DIR/munged.started" || true
fi

# --- configuration -------------------------------------------------------------------------------
HOST="$(hostname -s)"
CPUS="$(nproc)"
MEM_MB="$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)"
NODE="CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:8 State=UNKNOWN"
rm -rf "$DIR/state"
mkdir -p "$DIR/state" "$DIR/dev"
{
  echo "# written by tests/ecosystem/slurm_up.sh"
  echo "ClusterName=mocompile-test"
  echo "SlurmctldHost=$HOST"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "AuthType=auth/munge"
  echo "StateSaveLocation=$DIR/state"
  echo "SlurmdSpoolDir=$DIR/spool-%n"
  echo "SlurmctldPidFile=$DIR/slurmctld.pid"
  echo "SlurmdPidFile=$DIR/slurmd-%n.pid"
  echo "SlurmctldLogFile=$DIR/slurmctld.log"
  echo "SlurmdLogFile=$DIR/slurmd-%n.log"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "JobCompType=jobcomp/none"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_Core"
  echo "SchedulerType=sched/backfill"
  echo "MpiDefault=none"
  echo "ReturnToService=2"
  echo "SlurmdTimeout=300"
  echo "GresTypes=gpu"
  echo "NodeName=$HOST NodeAddr=127.0.0.1 Port=6818 Weight=1 $NODE"
  echo "NodeName=vnode1 NodeAddr=127.0.0.1 Port=6819 Weight=2 $NODE"
  if [[ "$VNODES" -ge 2 ]]; then
    echo "NodeName=vnode[2-$VNODES] NodeAddr=127.0.0.1 Port=6818 Weight=100 $NODE"
  fi
  for p in debug "$@"; do
    if [[ "$p" == debug ]]; then
      echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    else
      echo "PartitionName=$p Nodes=ALL MaxTime=INFINITE State=UP"
    fi
  done
} > "$DIR/slurm.conf"
# Slurm 22.05 drops file-less GPUs ("Removing file-less GPU") and wants character devices, so each
# fake GPU is a link to /dev/null. No job here touches a GPU; the count is what the tests need.
for i in 0 1 2 3 4 5 6 7; do ln -sfn /dev/null "$DIR/dev/nvidia$i"; done
{
  echo "NodeName=$HOST,vnode1 Name=gpu File=$DIR/dev/nvidia[0-7]"
  if [[ "$VNODES" -ge 2 ]]; then echo "NodeName=vnode[2-$VNODES] Name=gpu Count=8"; fi
} > "$DIR/gres.conf"
export SLURM_CONF="$DIR/slurm.conf"

log "starting slurmctld and 2 slurmd ($HOST and vnode1; $CPUS CPUs, $MEM_MB MB each)"
slurmctld -i
slurmd -N "$HOST"
slurmd -N vnode1
state=""
for _ in $(seq 300); do
  state="$(sinfo -h -p debug -o '%t' 2>/dev/null | sort -u | tr '\n' ' ' || true)"
  [[ "$state" == "idle " ]] && break
  sleep 0.1
done
if [[ "$state" != "idle " ]]; then
  echo "slurm_up.sh: node states are '${state:-unknown}', not all idle; logs in $DIR" >&2
  tail -n 20 "$DIR/slurmctld.log" "$DIR"/slurmd-*.log >&2 || true
  exit 1
fi
log "ready: $(sinfo -h -p debug -o '%D nodes %t')"
echo "SLURM_CONF=$SLURM_CONF"
