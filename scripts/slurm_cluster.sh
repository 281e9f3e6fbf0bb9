#!/usr/bin/env bash
# slurm_cluster.sh - a real one-machine SLURM cluster with N virtual nodes
# (default 2: n1, n2) for tests, CI and demos of monarch.job.SlurmJob.
#
#   scripts/slurm_cluster.sh up      # install if needed, start, wait until idle
#   scripts/slurm_cluster.sh up --netns [--link-rate 2gbit]
#                                    # each node in its own network namespace (see below)
#   scripts/slurm_cluster.sh down    # cancel every job, stop what `up` started
#   scripts/slurm_cluster.sh status  # sinfo + squeue; exit 0 iff all nodes usable
#
# Environment:
#   MONARCH_NB_SLURM_DIR      scratch dir for state/spool/pid/log files
#                             (default /var/tmp/monarch_nb_slurm)
#   MONARCH_NB_SLURM_NODES    number of virtual nodes (default 2, at most 254)
#   MONARCH_NB_SLURM_TIMEOUT  seconds `up` waits for the nodes (default 60)
#   MONARCH_NB_SLURM_CPUS     CPUs each virtual node offers (default 4)
#   MONARCH_NB_SLURM_NETNS    1: as `up --netns` (e.g. `MONARCH_NB_SLURM_NETNS=1 ./run.sh test`)
#   MONARCH_NB_SLURM_LINK_RATE  as `--link-rate` (default 2gbit; "none": not limited)
#
# --netns: a truer cluster. Node nK runs in network namespace mnb-nK with two links of
# its own, each a veth into a bridge of this machine:
#   mnb0  10.77.0.(10+K)/24 on bridge mnbr0 (10.77.0.1): the node's address (nK resolves
#         to it), used by SLURM, Monarch and the collectives;
#   mnb1  10.78.0.(10+K)/24 on bridge mnbr1 (10.78.0.1): a second network, so a test can
#         prove that a heal goes over the interface it names (RunConfig.heal_interface).
# What a node sends on either link is limited to --link-rate (tc tbf on the node's end):
# a node's uplink is what a heal's donor pays, so k donors can feed one victim k times as
# fast. The controller, slurmctld and munge stay in this namespace and reach the nodes over
# the bridges; `down` removes the namespaces, bridges and /etc/hosts lines again.
#
# Written for Debian 12 (SLURM 22.05, munge 0.5.15) without systemd, run as root
# (up/down re-exec themselves with sudo otherwise). It assumes no other SLURM
# runs on this machine: it owns /etc/slurm/slurm.conf (an existing foreign file is
# backed up once) and ports 6817 (slurmctld) and 17001.. (one slurmd per node).
#
# Why the non-obvious parts are the way they are:
# - No systemd and Docker's policy-rc.d (exit 101) blocks service auto-start after
#   apt-get install, so the munge key is created here and munged, slurmctld and the
#   slurmds are started by hand; their pid files live in the scratch dir.
# - Several slurmds on one machine: each node gets `slurmd -N nK`, its own
#   NodeAddr 127.0.1.K and Port 1700K, and its own spool/pid/log via `%n`. All
#   nodes share NodeHostname=<this hostname> (that is where slurmd really runs);
#   `127.0.1.K nK` lines in /etc/hosts make the node names resolvable.
# - ProctrackType=proctrack/linuxproc + TaskPlugin=task/none: no cgroups needed
#   (containers/gVisor have no usable cgroup tree). linuxproc kills a job's process
#   tree by parentage, which is what cleans up Monarch workers on scancel.
# - No accounting daemon (slurmdbd): accounting_storage/none, jobacct_gather/none.
# - SelectType=select/cons_tres + CR_CPU: memory is not a consumable, so every
#   virtual node may claim (almost) the whole machine's memory.
# - Each node says CPUs=4 (MONARCH_NB_SLURM_CPUS) even though all nodes share the
#   machine's cores: oversubscribed on purpose, so that several one-CPU allocations
#   (one per replica group) fit on a node, and the groups of a downed node fit on the
#   others. RealMemory is `slurmd -C`'s figure minus 5%, and
#   SlurmdParameters=config_overrides, so a node is never drained as
#   "Low RealMemory"/"Low CPUs" on a machine that reports slightly different
#   hardware (e.g. a 1-core CI box).
# - SlurmUser=root: simplest on a throw-away box; munged itself runs as `munge`
#   (it insists that the key is owned by the user running it).
# - ReturnToService=1 (FACTS used 2): a node marked DOWN because it stopped
#   responding (slurmd died or was restarted) returns by itself when its slurmd
#   registers again. With 2, a node set down BY HAND also returns by itself at the
#   next ping (~2 s later, measured), so a test's `scontrol update nodename=n2
#   state=down` did not stick, and its later `state=resume` failed ("Invalid node
#   state specified") when the node was already back. With 1 it stays down until
#   `scontrol update nodename=n2 state=resume` - or until `up`, which resumes any
#   down/drained node whose slurmd is running.
# - JobRequeue=0: when a node goes down under a batch job, SLURM's default is to
#   REQUEUE the whole job (it then sits PENDING and restarts later on the old port).
#   With 0 the job ends in NODE_FAIL instead, a terminal state a client can see.
#   (Note: monarch's SlurmJob does not list NODE_FAIL among its terminal states.)
# - SlurmdTimeout=10 (default 300): a slurmd that died is marked DOWN after ~10 s
#   (pings every SlurmdTimeout/3). MessageTimeout=5 (default 10) bounds RPCs.
#   KillWait=5 (default 30): SIGTERM -> SIGKILL gap on scancel, so a cancelled job
#   is gone in seconds even if its processes ignore SIGTERM.
# - SchedulerParameters=batch_sched_delay=0 (default 3 s): sbatch'd jobs are
#   scheduled on slurmctld's next background pass instead of up to 3 s later:
#   sbatch -> RUNNING 0.2-0.9 s here (srun/salloc jobs start at once anyway).
# - The daemons listen on all interfaces (slurmctld 6817, slurmd 1700K). Do NOT
#   add CommunicationParameters=NoInAddrAny: each slurmd then binds the address
#   of the machine's hostname (127.0.0.1), not its NodeAddr 127.0.1.K, and every
#   task launch fails with "Communication connection failure".
# - LLN=YES on the partition: each new job goes to the least loaded node, so replica
#   groups (one small allocation each) spread over the nodes instead of packing onto n1;
#   a downed node then takes out only the groups it held.
# - State, spool, pid and log files all live under one scratch dir, so `down`
#   plus `rm -rf $MONARCH_NB_SLURM_DIR` forgets everything (jobs ids included).
set -euo pipefail

SLURM_DIR="${MONARCH_NB_SLURM_DIR:-/var/tmp/monarch_nb_slurm}"
NUM_NODES="${MONARCH_NB_SLURM_NODES:-2}"
UP_TIMEOUT="${MONARCH_NB_SLURM_TIMEOUT:-60}"
NODE_CPUS="${MONARCH_NB_SLURM_CPUS:-4}"
NETNS="${MONARCH_NB_SLURM_NETNS:-0}"
LINK_RATE="${MONARCH_NB_SLURM_LINK_RATE:-2gbit}"
NET_PREFIXES=(10.77.0 10.78.0) # mnb0, mnb1 (bridges mnbr0, mnbr1 hold .1)
HOSTS_MARK="# monarch_nb slurm node"
CONF=/etc/slurm/slurm.conf
CONF_MARKER="# Generated by monarch_nb scripts/slurm_cluster.sh"
MUNGE_KEY=/etc/munge/munge.key
MUNGE_RUN=/run/munge
MUNGE_PIDFILE="$MUNGE_RUN/munged.pid"
MUNGE_LOG=/var/log/munge/munged.log
PACKAGES=(slurmctld slurmd slurm-client munge)
# SLURM node states (sinfo %t, without flags) that count as usable.
HEALTHY_STATES_RE='^(idle|alloc|mix)$'

T0=$EPOCHREALTIME

log() { echo "slurm_cluster: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
elapsed() { awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2fs", b - a }'; }

node_names() { local k; for ((k = 1; k <= NUM_NODES; k++)); do echo "n$k"; done; }

check_args() {
    if ! [[ "$NUM_NODES" =~ ^[0-9]+$ ]] || ((NUM_NODES < 1 || NUM_NODES > 254)); then
        die "MONARCH_NB_SLURM_NODES must be 1..254, got '$NUM_NODES'"
    fi
    [[ "$UP_TIMEOUT" =~ ^[0-9]+$ ]] || die "MONARCH_NB_SLURM_TIMEOUT must be seconds"
}

# up/down need root: re-exec under sudo, keeping our settings.
need_root() {
    if ((EUID != 0)); then
        command -v sudo >/dev/null || die "must run as root (no sudo found)"
        exec sudo --preserve-env=MONARCH_NB_SLURM_DIR,MONARCH_NB_SLURM_NODES,MONARCH_NB_SLURM_TIMEOUT,MONARCH_NB_SLURM_NETNS,MONARCH_NB_SLURM_LINK_RATE \
            "$0" "$@"
    fi
}

# ---------------------------------------------------------------- processes

# is_live PID: the process exists and is not a zombie. The daemons double-fork
# and their orphaned parents may linger as zombies (a container's pid 1 often
# does not reap), and `kill -0` succeeds on a zombie.
is_live() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ "${stat:0:1}" != [ZX] ]]
}

# pid_alive PIDFILE COMM: print the pid if PIDFILE names a live process called COMM.
pid_alive() {
    local pidfile=$1 comm=$2 pid
    [[ -r "$pidfile" ]] || return 1
    read -r pid <"$pidfile" 2>/dev/null || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$comm" ]] && is_live "$pid" || return 1
    echo "$pid"
}

# Fallback when a pid file is gone: pids of the exact daemon COMM whose command
# line contains all of the given words (e.g. "-N n2").
pids_by_name() {
    local comm=$1; shift
    local pid args w ok
    for pid in $(pgrep -x "$comm" || true); do
        is_live "$pid" || continue
        args=" $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) "
        ok=1
        for w in "$@"; do [[ "$args" == *" $w "* ]] || ok=0; done
        ((ok)) && echo "$pid"
    done
    return 0
}

slurmctld_pidfile() { echo "$SLURM_DIR/run/slurmctld.pid"; }
slurmd_pidfile() { echo "$SLURM_DIR/run/slurmd.$1.pid"; }

slurmctld_pid() { pid_alive "$(slurmctld_pidfile)" slurmctld || pids_by_name slurmctld | head -n1 | grep .; }
slurmd_pid() { pid_alive "$(slurmd_pidfile "$1")" slurmd || pids_by_name slurmd -N "$1" | head -n1 | grep .; }
munged_pid() { pid_alive "$MUNGE_PIDFILE" munged || pids_by_name munged | head -n1 | grep .; }

# stop_pids WHAT PID...: SIGTERM, wait up to 10 s, then SIGKILL and wait again.
stop_pids() {
    local what=$1; shift
    local pids=("$@") i alive p
    ((${#pids[@]})) || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for ((i = 0; i < 200; i++)); do
        alive=()
        for p in "${pids[@]}"; do is_live "$p" && alive+=("$p"); done
        ((${#alive[@]})) || return 0
        ((i == 100)) && { log "$what did not stop on SIGTERM, sending SIGKILL"; kill -KILL "${alive[@]}" 2>/dev/null || true; }
        sleep 0.05
    done
    die "$what (pids ${alive[*]}) still running after SIGKILL"
}

show_logs() {
    local f
    for f in "$MUNGE_LOG" "$SLURM_DIR/log/slurmctld.log" "$SLURM_DIR"/log/slurmd.*.log; do
        [[ -s "$f" ]] || continue
        echo "----- tail of $f" >&2
        tail -n 25 "$f" >&2
    done
}

# ---------------------------------------------------------------- install

ensure_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get (Debian/Ubuntu only)"
    log "installing ${missing[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    local aptlog="$SLURM_DIR/log/apt.log"
    if ! { apt-get update && apt-get install -y --no-install-recommends "${missing[@]}"; } >"$aptlog" 2>&1; then
        tail -n 25 "$aptlog" >&2
        die "apt-get install ${missing[*]} failed (log: $aptlog)"
    fi
}

# ---------------------------------------------------------------- munge

ensure_munge() {
    if [[ ! -s "$MUNGE_KEY" ]]; then
        log "creating $MUNGE_KEY"
        install -d -o munge -g munge -m 700 /etc/munge
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile="$MUNGE_KEY" --force
        else
            dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none
        fi
    fi
    chown munge:munge "$MUNGE_KEY"
    chmod 400 "$MUNGE_KEY"

    munged_pid >/dev/null && return 0
    install -d -o munge -g munge -m 755 "$MUNGE_RUN"
    install -d -o munge -g munge -m 700 /var/log/munge /var/lib/munge
    runuser -u munge -- /usr/sbin/munged || { show_logs; die "munged failed to start"; }
    local i pid=""
    for ((i = 0; i < 100; i++)); do
        pid=$(munged_pid) && break
        sleep 0.05
    done
    [[ -n "$pid" ]] || { show_logs; die "munged did not come up"; }
    # Remember that we started it: `down` stops only a munged that `up` started.
    echo "$pid" >"$SLURM_DIR/run/munged.started"
}

# ---------------------------------------------------------------- config

real_memory_mb() {
    local mem
    mem=$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -n1)
    [[ -n "$mem" ]] || mem=$(awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo)
    echo $((mem * 95 / 100))
}

render_conf() {
    local host mem k
    host=$(hostname -s)
    mem=$(real_memory_mb)
    cat <<EOF
$CONF_MARKER - do not edit, it is rewritten by \`up\`.
ClusterName=monarch_nb
SlurmctldHost=$host($(controller_addr))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
ReturnToService=1
JobRequeue=0
KillWait=5
SlurmdTimeout=10
MessageTimeout=5
SlurmdParameters=config_overrides
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool/slurmd.%n
SlurmctldPidFile=$SLURM_DIR/run/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/run/slurmd.%n.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd.%n.log
SlurmctldPort=6817
EOF
    for ((k = 1; k <= NUM_NODES; k++)); do
        echo "NodeName=n$k NodeHostname=$host NodeAddr=$(node_addr "$k") Port=$((17000 + k)) CPUs=$NODE_CPUS SocketsPerBoard=1 CoresPerSocket=$NODE_CPUS ThreadsPerCore=1 RealMemory=$mem State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP LLN=YES"
}

# write_conf: returns 0 if the file changed.
write_conf() {
    local new
    new=$(render_conf)
    if [[ -f "$CONF" ]] && [[ "$(cat "$CONF")" == "$new" ]]; then
        return 1
    fi
    install -d -m 755 /etc/slurm
    if [[ -f "$CONF" ]] && ! grep -qF "$CONF_MARKER" "$CONF" && [[ ! -e "$CONF.monarch_nb.bak" ]]; then
        log "backing up foreign $CONF to $CONF.monarch_nb.bak"
        cp -p "$CONF" "$CONF.monarch_nb.bak"
    fi
    printf '%s\n' "$new" >"$CONF.tmp.$$"
    chmod 644 "$CONF.tmp.$$"
    mv -f "$CONF.tmp.$$" "$CONF"
    log "wrote $CONF ($NUM_NODES nodes)"
    return 0
}

# The address of node K (NodeAddr, and what nK resolves to) and of the controller.
node_addr() { if ((NETNS)); then echo "${NET_PREFIXES[0]}.$((10 + $1))"; else echo "127.0.1.$1"; fi; }
controller_addr() { if ((NETNS)); then echo "${NET_PREFIXES[0]}.1"; else echo 127.0.0.1; fi; }

# /etc/hosts: one "ADDR nK" line per node, for this mode. Rewritten in place (in a container
# /etc/hosts is a bind mount: it cannot be replaced by a rename).
ensure_hosts() {
    local k want kept
    # each node's name also for its IPv6-mapped form: torch looks that up on every store connect
    want=$(for ((k = 1; k <= NUM_NODES; k++)); do
        echo "$(node_addr "$k") n$k $HOSTS_MARK"; echo "::ffff:$(node_addr "$k") n$k-v4mapped $HOSTS_MARK"; done)
    kept=$(hosts_without_nodes)
    [[ "$(cat /etc/hosts)" == "$kept"$'\n'"$want" ]] && return 0
    printf '%s\n%s\n' "$kept" "$want" >/etc/hosts || die "cannot write the node lines to /etc/hosts"
}

# /etc/hosts without our node lines (marked, or the unmarked 127.0.1.K nK lines of older versions).
hosts_without_nodes() {
    grep -vE "($HOSTS_MARK\$|^127\.0\.1\.[0-9]+[[:space:]]+n[0-9]+[[:space:]]*\$)" /etc/hosts || true
}

# ---------------------------------------------------------------- network namespaces

ns_name() { echo "mnb-n$1"; }

# netns_up: namespaces, veths, bridges, addresses and rate limits for every node (idempotent).
netns_up() {
    if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
        local PACKAGES=(iproute2)
        ensure_packages
    fi
    [[ "$LINK_RATE" == none || "$LINK_RATE" =~ ^[0-9]+(\.[0-9]+)?[kmg]?bit$ ]] \
        || die "--link-rate: '$LINK_RATE' is not a rate like 2gbit, 500mbit or none"
    local i k ns br root
    netns_prune
    for i in 0 1; do
        br="mnbr$i"
        if ! ip link show "$br" >/dev/null 2>&1; then
            ip link add "$br" type bridge || die "cannot create bridge $br: network namespaces need root and CAP_NET_ADMIN (use \`up\` without --netns here)"
            ip addr add "${NET_PREFIXES[$i]}.1/24" dev "$br"
        fi
        ip link set "$br" up
    done
    for ((k = 1; k <= NUM_NODES; k++)); do
        ns=$(ns_name "$k")
        ip netns list | grep -qx "$ns\( .*\)\?" || ip netns add "$ns" || die "cannot create network namespace $ns"
        ip -n "$ns" link set lo up
        for i in 0 1; do
            root="mnb${i}n$k"
            if ! ip link show "$root" >/dev/null 2>&1; then
                ip link add "$root" type veth peer name "mnb$i" netns "$ns"
                ip link set "$root" master "mnbr$i"
                ip -n "$ns" addr add "${NET_PREFIXES[$i]}.$((10 + k))/24" dev "mnb$i"
            fi
            ip link set "$root" up
            ip -n "$ns" link set "mnb$i" up
            tc -n "$ns" qdisc del dev "mnb$i" root 2>/dev/null || true
            if [[ "$LINK_RATE" != none ]]; then
                tc -n "$ns" qdisc add dev "mnb$i" root tbf rate "$LINK_RATE" burst 512kb latency 100ms \
                    || die "tc: cannot limit mnb$i of $ns to $LINK_RATE"
            fi
        done
    done
    echo "$LINK_RATE" >"$SLURM_DIR/run/netns"
}

# node_namespaces: the names of every node namespace there is (mnb-nK), of any cluster size.
node_namespaces() { ip netns list 2>/dev/null | awk '$1 ~ /^mnb-n[0-9]+$/ { print $1 }'; }

# netns_prune: remove the namespaces of nodes beyond NUM_NODES (a larger cluster brought up before).
netns_prune() {
    local ns
    command -v ip >/dev/null || return 0
    for ns in $(node_namespaces); do
        ((${ns#mnb-n} <= NUM_NODES)) || ip netns del "$ns" || log "cannot delete network namespace $ns"
    done
}

# netns_down: remove every namespace, veth and bridge netns_up made (also of a larger cluster).
netns_down() {
    local ns i
    command -v ip >/dev/null || return 0
    for ns in $(node_namespaces); do
        ip netns del "$ns" || log "cannot delete network namespace $ns"
    done
    for i in 0 1; do ip link del "mnbr$i" 2>/dev/null || true; done
    rm -f "$SLURM_DIR/run/netns"
}

# run_on_node K CMD...: CMD where node K's daemons run (its namespace with --netns).
run_on_node() {
    local k=$1; shift
    # nsenter, not `ip netns exec`: that also remounts /sys, hiding /sys/fs/cgroup from slurmd
    if ((NETNS)); then nsenter --net="/run/netns/$(ns_name "$k")" "$@"; else "$@"; fi
}

ensure_dirs() {
    install -d -m 755 "$SLURM_DIR" "$SLURM_DIR/run" "$SLURM_DIR/log" "$SLURM_DIR/spool"
    install -d -m 700 "$SLURM_DIR/state"
}

# ---------------------------------------------------------------- cluster

# Prints "node state" lines; the state without sinfo's suffix flags is in $2,
# the raw one (e.g. idle*, drain) in $3.
node_states() {
    sinfo -h -N -o '%N %t' 2>/dev/null | awk '!seen[$1]++ { s = $2; gsub(/[^a-z]/, "", s); print $1, s, $2 }'
}

# all_healthy: every expected node is listed with a usable state and no flag.
all_healthy() {
    local states n line raw
    states=$(node_states) || return 1
    for n in $(node_names); do
        line=$(grep -E "^$n " <<<"$states") || return 1
        read -r _ _ raw <<<"$line"
        [[ "$raw" =~ $HEALTHY_STATES_RE ]] || return 1
    done
    return 0
}

resume_bad_nodes() {
    local n s raw
    while read -r n s raw; do
        # "down*" = not responding: resuming cannot help, its slurmd must register
        [[ -n "$n" && "$raw" != *'*'* ]] || continue
        case "$s" in
            down | drain | drng | drained | draining | fail | failg | inval)
                log "node $n is $raw: resuming"
                scontrol update nodename="$n" state=resume 2>/dev/null || true
                ;;
        esac
    done < <(node_states)
}

start_daemons() {
    local n
    if ! slurmctld_pid >/dev/null; then
        slurmctld || { show_logs; die "slurmctld failed to start"; }
    fi
    local k
    for ((k = 1; k <= NUM_NODES; k++)); do
        n="n$k"
        if ! slurmd_pid "$n" >/dev/null; then
            install -d -m 755 "$SLURM_DIR/spool/slurmd.$n"
            run_on_node "$k" slurmd -N "$n" || { show_logs; die "slurmd -N $n failed to start"; }
        fi
    done
}

daemons_running() {
    local n
    munged_pid >/dev/null && slurmctld_pid >/dev/null || return 1
    for n in $(node_names); do slurmd_pid "$n" >/dev/null || return 1; done
}

# wait_healthy SECONDS: poll sinfo until every node is usable; every second,
# resume nodes that are down/drained while responding (e.g. set down by hand
# before the last `down`: slurmctld restores that state from StateSaveLocation).
wait_healthy() {
    local deadline=$((SECONDS + $1)) polls=0
    until all_healthy; do
        ((SECONDS < deadline)) || return 1
        # a fresh controller may take a moment to answer; don't resume too eagerly
        ((++polls % 10 == 0)) && resume_bad_nodes
        daemons_running || { log "a daemon died while waiting"; return 1; }
        sleep 0.1
    done
}

summary() {
    local states
    states=$(node_states | awk '{ printf "%s%s=%s", sep, $1, $3; sep = " " }')
    local net=""
    ((NETNS)) && net=", each in its own network namespace (mnb0 ${NET_PREFIXES[0]}.0/24, mnb1 ${NET_PREFIXES[1]}.0/24, links $LINK_RATE)"
    echo "slurm cluster up: $NUM_NODES nodes [$states]$net, partition debug, conf $CONF, dir $SLURM_DIR ($(elapsed))"
}

# The network mode the daemons now run in: "none" (one namespace) or the nodes' link rate.
running_net() { cat "$SLURM_DIR/run/netns" 2>/dev/null || echo none-shared; }

cmd_up() {
    need_root up
    local want_net=none-shared
    ((NETNS)) && want_net=$LINK_RATE && netns_prune
    # Fast path: everything already runs with this very config -> check, resume, done.
    if command -v slurmd >/dev/null && [[ -f "$CONF" ]] && [[ "$(running_net)" == "$want_net" ]] \
        && [[ "$(cat "$CONF")" == "$(render_conf)" ]] && daemons_running; then
        if ! all_healthy; then
            resume_bad_nodes
            wait_healthy "$UP_TIMEOUT" || { sinfo >&2 || true; show_logs; die "nodes not idle after ${UP_TIMEOUT}s"; }
        fi
        summary
        return 0
    fi

    ensure_dirs
    ensure_packages
    ensure_munge
    if [[ "$(running_net)" != "$want_net" ]] && { slurmctld_pid >/dev/null || [[ -n "$(pids_by_name slurmd)" ]]; }; then
        log "network mode changed: restarting the slurm daemons"
        stop_slurm
    fi
    if ((NETNS)); then netns_up; else netns_down; fi
    ensure_hosts
    if write_conf && { slurmctld_pid >/dev/null || [[ -n "$(pids_by_name slurmd)" ]]; }; then
        log "config changed: restarting the slurm daemons"
        stop_slurm
    fi
    start_daemons
    if ! wait_healthy "$UP_TIMEOUT"; then
        sinfo >&2 || true
        show_logs
        die "nodes not all idle after ${UP_TIMEOUT}s"
    fi
    summary
}

# Cancel all jobs, wait (bounded) until the queue is empty, stop the slurm daemons.
stop_slurm() {
    local ids pids=() n p i
    if slurmctld_pid >/dev/null; then
        ids=$(squeue -h -o '%A' 2>/dev/null || true)
        if [[ -n "$ids" ]]; then
            log "cancelling jobs: ${ids//$'\n'/ }"
            # shellcheck disable=SC2086
            scancel $ids 2>/dev/null || true
            for ((i = 0; i < 300; i++)); do # KillWait=5 + margin
                [[ -z "$(squeue -h -o '%A' 2>/dev/null)" ]] && break
                sleep 0.1
            done
            [[ -z "$(squeue -h -o '%A' 2>/dev/null)" ]] || log "jobs still listed after 30s: stopping anyway"
        fi
    fi
    for n in $(node_names); do
        p=$(slurmd_pid "$n") && pids+=("$p")
    done
    for p in $(pids_by_name slurmd); do [[ " ${pids[*]} " == *" $p "* ]] || pids+=("$p"); done
    stop_pids slurmd "${pids[@]}"
    pids=()
    for p in $(slurmctld_pid || true; pids_by_name slurmctld); do
        [[ " ${pids[*]} " == *" $p "* ]] || pids+=("$p")
    done
    stop_pids slurmctld "${pids[@]}"
    # job step daemons orphaned by a dead slurmd (they die with their jobs normally)
    pids=()
    for p in $(pids_by_name slurmstepd); do pids+=("$p"); done
    stop_pids slurmstepd "${pids[@]}"
}

cmd_down() {
    need_root down
    command -v slurmctld >/dev/null || { log "slurm not installed: nothing to stop"; return 0; }
    stop_slurm
    if [[ -e "$SLURM_DIR/run/netns" ]]; then
        netns_down
        NETNS=0 ensure_hosts # back to one namespace's node addresses
    fi
    local pid started
    if [[ -r "$SLURM_DIR/run/munged.started" ]]; then
        read -r started <"$SLURM_DIR/run/munged.started" || true
        if pid=$(munged_pid) && [[ "$pid" == "$started" ]]; then
            stop_pids munged "$pid"
        fi
        rm -f "$SLURM_DIR/run/munged.started"
    fi
    echo "slurm cluster down ($(elapsed))"
}

cmd_status() {
    command -v sinfo >/dev/null || { echo "slurm is not installed"; return 1; }
    if ! sinfo 2>&1; then
        echo "slurmctld is not reachable"
        return 1
    fi
    squeue 2>&1 || true
    if all_healthy; then
        return 0
    fi
    echo "not all of $(node_names | xargs) are idle/allocated/mixed"
    return 1
}

main() {
    check_args
    local cmd=${1:-}
    shift || true
    while (($#)); do
        case "$1" in
            --netns) NETNS=1 ;;
            --link-rate) LINK_RATE=${2:?--link-rate needs a rate, e.g. 2gbit}; shift ;;
            *) echo "usage: $0 up [--netns [--link-rate RATE]] | down | status" >&2; exit 2 ;;
        esac
        shift
    done
    [[ "$NETNS" =~ ^[01]$ ]] || die "MONARCH_NB_SLURM_NETNS must be 0 or 1, got '$NETNS'"
    export MONARCH_NB_SLURM_NETNS=$NETNS MONARCH_NB_SLURM_LINK_RATE=$LINK_RATE # kept across need_root's sudo
    case "$cmd" in
        up) cmd_up ;;
        down) cmd_down ;;
        status) cmd_status ;;
        *)
            echo "usage: $0 up [--netns [--link-rate RATE]] | down | status" >&2
            exit 2
            ;;
    esac
}

main "$@"
