#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, for the tests and for trying the sbatch scripts:
#
#   bash slurm/local_cluster.sh up       # install what is missing, write the config, start, wait until idle
#   export SLURM_CONF=/tmp/sentemb-slurm/slurm.conf   # (printed by `up`) then sbatch, srun, squeue as usual
#   bash slurm/local_cluster.sh status
#   bash slurm/local_cluster.sh down     # stop what `up` started, by the PIDs it recorded
#
# Needs root (the daemons run as root, munged as its own user) and Debian's packages slurmctld, slurmd,
# slurm-client and munge, which `up` installs with apt-get when they are missing. The node is this machine:
# its CPUs and 90 % of its memory; one partition, `cpu`. Process tracking by /proc (proctrack/linuxproc) and no
# task plugin (task/none), which need no cgroups. The credential lifetime is 10 s (AuthInfo=cred_expire=10): a
# requeued job may start again only once the credential of its previous run expired, 120 s by default, so a
# requeued test job waits seconds, not two minutes (docs/CLUSTER.md).
#
# SENTEMB_SLURM_DIR (default /tmp/sentemb-slurm) holds the config, state, logs and PID files.
set -euo pipefail
DIR=${SENTEMB_SLURM_DIR:-/tmp/sentemb-slurm}
CONF=$DIR/slurm.conf
PACKAGES=(slurmctld slurmd slurm-client munge)

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

write_config() {
    local host cpus memory
    host=$(hostname -s)
    cpus=$(nproc)
    memory=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
    cat > "$CONF" <<EOF
# written by slurm/local_cluster.sh: one node, this machine
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
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
NodeName=$host CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=cpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1" 2>/dev/null)" 2>/dev/null; }

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

up() {
    [ "$(id -u)" -eq 0 ] || { say "needs root (the daemons run as root)"; return 77; }
    install_packages
    mkdir -p "$DIR"
    if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid"; then
        say "already up"
        echo "export SLURM_CONF=$CONF"
        return 0
    else
        write_config
        start_munge
        alive "$DIR/slurmctld.pid" || slurmctld -f "$CONF"
        alive "$DIR/slurmd.pid" || slurmd -f "$CONF"
    fi
    local start=$SECONDS
    until SLURM_CONF=$CONF sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; do
        if (( SECONDS - start > 60 )); then
            say "the node did not become idle in 60 s; see $DIR/log"; SLURM_CONF=$CONF sinfo >&2 || true
            return 1
        fi
        sleep 0.5
    done
    say "up in $((SECONDS - start)) s after the daemons started; export SLURM_CONF=$CONF"
    echo "export SLURM_CONF=$CONF"
}

down() {
    for pidfile in "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/munge/munged.pid"; do
        if alive "$pidfile"; then
            kill "$(cat "$pidfile")" 2>/dev/null || true
            for _ in $(seq 50); do alive "$pidfile" || break; sleep 0.1; done
        fi
        rm -f "$pidfile"
    done
    say "down"
}

status() {
    alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid" || { say "not running"; return 1; }
    SLURM_CONF=$CONF sinfo
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
