#!/usr/bin/env bash
# A real SLURM cluster of one or several nodes on this machine, for the tests and for trying the sbatch scripts:
#
#   bash slurm/local_cluster.sh up [--nodes N]   # install what is missing, write the config, start a new
#                                                # cluster, wait until all N nodes are idle (default 2)
#   export SLURM_CONF=/tmp/sentemb-slurm/slurm.conf   # (printed by `up`) then sbatch, srun, squeue as usual
#   bash slurm/local_cluster.sh status
#   bash slurm/local_cluster.sh down     # stop what `up` started, by the PIDs it recorded
#
# Needs root (the daemons run as root, munged as its own user) and Debian's packages slurmctld, slurmd,
# slurm-client and munge, which `up` installs with apt-get when they are missing. Each node is a `slurmd -N
# sentembK` of this machine (Debian's slurmd is built with multiple-slurmd support), with its own port (6818, 6819,
# ...), spool folder, log and PID file; each node offers all of this machine's CPUs (N nodes oversubscribe them
# N times) and 90 % of its memory divided by N; one partition, `cpu`. The node names must resolve, as a real
# cluster's do (Lightning takes the rendezvous host from SLURM_NODELIST): `up` adds `127.0.0.1 sentemb1 ...` to
# /etc/hosts when a name does not resolve, and `down` takes that line out again. Process tracking by /proc
# (proctrack/linuxproc) and no task plugin (task/none), which need no cgroups. The credential lifetime is 10 s
# (AuthInfo=cred_expire=10): a requeued job may start again only once the credential of its previous run expired,
# 120 s by default, so a requeued test job waits seconds, not two minutes (docs/CLUSTER.md).
#
# SENTEMB_SLURM_DIR (default /tmp/sentemb-slurm) holds the config, state, logs and PID files.
set -euo pipefail
DIR=${SENTEMB_SLURM_DIR:-/tmp/sentemb-slurm}
CONF=$DIR/slurm.conf
PACKAGES=(slurmctld slurmd slurm-client munge)
PREFIX=sentemb                  # node names: sentemb1, sentemb2, ...
SLURMD_PORT=6818                # node K listens on SLURMD_PORT + K - 1
HOSTS_MARK="# slurm/local_cluster.sh"

say() { echo "local_cluster: $*" >&2; }

install_packages() {
    local missing=()
    for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    command -v apt-get >/dev/null || { say "cannot install ${missing[*]}: no apt-get"; return 1; }
    say "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || {
        apt-get update -qq >/dev/null 2>&1
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    }
}

node_names() { local k; for k in $(seq "$1"); do echo "$PREFIX$k"; done; }

write_config() {
    local nodes=$1 host cpus memory k
    host=$(hostname -s)
    cpus=$(nproc)
    memory=$(awk -v n="$nodes" '/MemTotal/ {printf "%d", $2 / 1024 * 0.9 / n}' /proc/meminfo)
    mkdir -p "$DIR/state" "$DIR/log"
    for k in $(seq "$nodes"); do mkdir -p "$DIR/spool/$PREFIX$k"; done
    cat > "$CONF" <<CONF
# written by slurm/local_cluster.sh: $nodes node(s), each a slurmd of this machine ($host)
ClusterName=sentemb
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
ReturnToService=2
JobRequeue=1
KillWait=10
MinJobAge=3600
MailProg=/bin/true
StateSaveLocation=$DIR/state
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmctldPort=6817
# %n: the node's name, so that each slurmd of this machine has its own spool, log and PID file
SlurmdSpoolDir=$DIR/spool/%n
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmdLogFile=$DIR/log/slurmd-%n.log
CONF
    for k in $(seq "$nodes"); do
        echo "NodeName=$PREFIX$k NodeHostname=$host Port=$((SLURMD_PORT + k - 1)) CPUs=$cpus RealMemory=$memory State=UNKNOWN"
    done >> "$CONF"
    echo "PartitionName=cpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >> "$CONF"
}

# Node names that do not resolve go to 127.0.0.1 in /etc/hosts, on one marked line that `down` removes.
resolve_names() {
    local missing=() name
    for name in "$@"; do getent hosts "$name" >/dev/null || missing+=("$name"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    say "adding 127.0.0.1 ${missing[*]} to /etc/hosts"
    echo "127.0.0.1 ${missing[*]} $HOSTS_MARK" >> /etc/hosts
}

unresolve_names() {
    grep -qF "$HOSTS_MARK" /etc/hosts 2>/dev/null || return 0
    local kept
    kept=$(grep -vF "$HOSTS_MARK" /etc/hosts)
    printf '%s\n' "$kept" > /etc/hosts  # in place: /etc/hosts may be a mount that cannot be replaced
}

# A PID file's process is alive and is one of the daemons (a stale file's PID may belong to another process now).
alive() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null \
        && grep -qxE 'slurmd|slurmctld|munged' "/proc/$pid/comm" 2>/dev/null
}

start_munge() {
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        return 0  # a munged already answers (the machine's own): use it, and leave it running
    fi
    mkdir -p /run/munge "$DIR/munge" && chown munge:munge /run/munge "$DIR/munge" && chmod 755 /run/munge
    [ -f /etc/munge/munge.key ] || { /usr/sbin/mungekey --create >/dev/null 2>&1 || create-munge-key -f; }
    # munged writes its PID file as the munge user, in a folder of its own; started here, `down` stops it
    runuser -u munge -- /usr/sbin/munged --pid-file="$DIR/munge/munged.pid"
    for _ in $(seq 50); do alive "$DIR/munge/munged.pid" && return 0; sleep 0.1; done
    say "munged did not start"; return 1
}

running_nodes() { [ -f "$DIR/nodes" ] && cat "$DIR/nodes" || echo 0; }

# Nodes that can take a job: idle, or running jobs already (a drained or down node's state carries a suffix).
usable_nodes() { SLURM_CONF=$CONF sinfo -h -N -o "%N %t" 2>/dev/null | grep -cE ' (idle|mix|alloc)$' || true; }

# Each node's state and, for a drained or down one, the reason slurm gives.
node_states() { SLURM_CONF=$CONF sinfo -N -o "%N %t %E"; }

all_alive() {
    local n=$1 name
    alive "$DIR/slurmctld.pid" || return 1
    for name in $(node_names "$n"); do alive "$DIR/slurmd-$name.pid" || return 1; done
}

up() {
    local nodes=2 name
    while [ $# -gt 0 ]; do
        case "$1" in
            --nodes) nodes=${2:-}; shift 2 || true ;;
            --nodes=*) nodes=${1#--nodes=}; shift ;;
            *) say "error: unknown option $1 (usage: up [--nodes N])"; return 2 ;;
        esac
    done
    [[ "$nodes" =~ ^[1-9][0-9]*$ ]] || { say "error: --nodes ${nodes:-(none)}: expected a whole number >= 1"; return 2; }
    [ "$(id -u)" -eq 0 ] || { say "needs root (the daemons run as root)"; return 77; }
    install_packages
    mkdir -p "$DIR"
    if all_alive "$(running_nodes)" && [ "$(running_nodes)" -gt 0 ]; then
        if [ "$(running_nodes)" -ne "$nodes" ]; then
            say "error: already up with $(running_nodes) node(s), not $nodes; run down first"; return 1
        fi
        local usable
        usable=$(usable_nodes)
        if [ "$usable" -eq "$nodes" ]; then
            say "already up"
            echo "export SLURM_CONF=$CONF"
            return 0
        fi
        say "up, but only $usable of $nodes node(s) can take jobs; starting afresh:"; node_states >&2 || true
    fi
    down_quietly
    # A new `up` is a new cluster. The saved state of an earlier one would bring back its jobs and its drained nodes:
    # a node drained once (slurmd drains itself with "SlurmdSpoolDir is full" on a full disk) stays drained across
    # restarts, and every job then waits for it.
    rm -rf "$DIR/state" "$DIR/spool"
    local start=$SECONDS start_ms
    start_ms=$(( $(date +%s%N) / 1000000 ))
    write_config "$nodes"
    # shellcheck disable=SC2046
    resolve_names $(node_names "$nodes")
    start_munge
    echo "$nodes" > "$DIR/nodes"
    slurmctld -f "$CONF"
    for name in $(node_names "$nodes"); do slurmd -f "$CONF" -N "$name"; done
    local idle=0
    until [ "$idle" -eq "$nodes" ]; do
        idle=$(usable_nodes)
        if (( SECONDS - start > 60 )); then
            say "only $idle of $nodes node(s) idle after 60 s; see $DIR/log"; node_states >&2 || true
            down_quietly  # nothing half-started stays up for a later `up` to take as a working cluster
            return 1
        fi
        [ "$idle" -eq "$nodes" ] || sleep 0.2
    done
    local ms=$(( $(date +%s%N) / 1000000 - start_ms ))
    say "$nodes node(s) idle $((ms / 1000)).$(printf %03d $((ms % 1000))) s after the start of the daemons; export SLURM_CONF=$CONF"
    echo "export SLURM_CONF=$CONF"
}

# What an earlier `up` left behind (a crash, a reboot's stale PID files) is stopped before a new start.
down_quietly() {
    local pidfile
    for pidfile in "$DIR"/slurmd-*.pid "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/munge/munged.pid"; do
        [ -e "$pidfile" ] || continue
        if alive "$pidfile"; then
            kill "$(cat "$pidfile")" 2>/dev/null || true
            for _ in $(seq 50); do alive "$pidfile" || break; sleep 0.1; done
        fi
        rm -f "$pidfile"
    done
    rm -f "$DIR/nodes"
}

down() {
    down_quietly
    unresolve_names
    say "down"
}

status() {
    all_alive "$(running_nodes)" && [ "$(running_nodes)" -gt 0 ] || { say "not running"; return 1; }
    SLURM_CONF=$CONF sinfo -N
}

case "${1:-}" in
    up) shift; up "$@" ;;
    down) down ;;
    status) status ;;
    *) echo "usage: $0 up [--nodes N]|down|status" >&2; exit 2 ;;
esac
