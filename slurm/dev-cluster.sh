#!/usr/bin/env bash
# A real single-node SLURM cluster (munge, MariaDB, slurmdbd, slurmctld, slurmd) for development
# and tests, with every config file, socket, PID, spool and log under one directory.
#
#   slurm/dev-cluster.sh up DIR       # install if missing (Debian 12, as root), start, print env
#   eval "$(slurm/dev-cluster.sh env DIR)"   # or: . DIR/env.sh
#   sbatch --wrap 'hostname'; sacct
#   slurm/dev-cluster.sh status DIR   # which daemons of DIR are alive
#   slurm/dev-cluster.sh down DIR     # stop exactly what `up DIR` started, by PID; keep DIR/log
#
# Measured on a 2-core Debian 12 VM: first `apt-get install` 77 s; `up` 10-15 s on a fresh DIR,
# 3-4 s on a DIR used before; `down` 2-5 s. slurm/README.md: layout, knobs, preemption in tests.
#
# Environment knobs (all optional):
#   DEV_CLUSTER_GPUS=2          fake GPUs (GRES gpu on DIR/dev/fakegpuN character devices)
#   DEV_CLUSTER_PARTITION=dev   name of the default partition (a second one, "urgent", preempts it)
#   DEV_CLUSTER_TIMEOUT_S=60    bound on each readiness wait, seconds
set -euo pipefail

PACKAGES=(slurm-wlm slurmdbd munge mariadb-server)
BINARIES=(munged munge unmunge mariadbd mariadb-install-db mariadb slurmdbd slurmctld slurmd
          sbatch srun squeue sacct sacctmgr scontrol scancel sinfo)
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)   # start order; `down` stops in reverse
GPUS="${DEV_CLUSTER_GPUS:-2}"
PARTITION="${DEV_CLUSTER_PARTITION:-dev}"
TIMEOUT_S="${DEV_CLUSTER_TIMEOUT_S:-60}"
CLUSTER=dev

say() { echo "dev-cluster: $*" >&2; }
die() { echo "dev-cluster: error: $*" >&2; exit 1; }
die_install() { echo "dev-cluster: error: $*" >&2; exit 3; }  # tests skip (not fail) on exit 3

usage() {
    cat >&2 <<'EOF'
usage: dev-cluster.sh up|down|status|env DIR   (exit 3: packages missing and not installable)
  up DIR      install slurm/munge/mariadb if missing (apt, root), start the cluster under DIR,
              print the client environment (also written to DIR/env.sh); no-op if running
  down DIR    stop the daemons `up DIR` started (by PID), cancel its jobs; logs stay in DIR/log
  status DIR  print each daemon's state; exit 0 only if all are running
  env DIR     print the client environment of a running DIR
EOF
    exit 2
}

# ---------------------------------------------------------------------------------------------
# processes: each daemon runs in the foreground of its own session, its PID in DIR/run/NAME.pid,
# and carries DEV_CLUSTER_DIR=DIR in its environment so a recycled PID is never mistaken for it.

marked() {  # marked PID -> 0 if PID is alive and was started by `up DIR`
    local pid="$1"
    grep -qzxF "DEV_CLUSTER_DIR=$DIR" "/proc/$pid/environ" 2>/dev/null
}

daemon_pid() {  # daemon_pid NAME -> prints the PID if that daemon of DIR is alive
    local f="$DIR/run/$1.pid" pid
    [[ -s "$f" ]] || return 1
    pid="$(<"$f")"
    marked "$pid" || return 1
    echo "$pid"
}

start_daemon() {  # start_daemon NAME CMD... (foreground mode; output to DIR/log/NAME.out)
    local name="$1"; shift
    DEV_CLUSTER_DIR="$DIR" SLURM_CONF="$DIR/etc/slurm.conf" \
        setsid "$@" </dev/null >>"$DIR/log/$name.out" 2>&1 &
    local pid="$!"
    echo "$pid" >"$DIR/run/$name.pid"
    # Until the forked shell has exec'd, /proc/PID/environ lacks the mark and daemon_pid would
    # call the daemon dead (a loaded machine can take seconds): wait for the exec, or its death.
    local deadline=$((SECONDS + TIMEOUT_S))
    while alive "$pid" && ! marked "$pid"; do
        if ((SECONDS >= deadline)); then
            kill -KILL "$pid" 2>/dev/null || true  # unmarked, so `down` would not find it
            fail_start "$name" "$DIR/log/$name.out" "was not exec'd within ${TIMEOUT_S} s"
        fi
        sleep 0.05
    done
}

fail_start() {  # fail_start NAME LOG MESSAGE: show the log, stop what was started, exit 1
    local name="$1" logf="$2" msg="$3"
    echo "dev-cluster: error: $name $msg; its log is $logf (last lines below)" >&2
    if [[ -f "$logf" ]]; then tail -n 25 "$logf" | sed 's/^/    /' >&2; fi
    if [[ -f "$DIR/log/$name.out" && "$DIR/log/$name.out" != "$logf" ]]; then
        tail -n 10 "$DIR/log/$name.out" | sed 's/^/    /' >&2
    fi
    do_down >&2 || true
    exit 1
}

wait_for() {  # wait_for NAME LOG CHECK... : poll CHECK until it succeeds or TIMEOUT_S passes
    local name="$1" logf="$2"; shift 2
    local deadline=$((SECONDS + TIMEOUT_S))
    while ! "$@" >/dev/null 2>&1; do
        if ! daemon_pid "$name" >/dev/null; then
            fail_start "$name" "$logf" "exited during startup"
        fi
        if ((SECONDS >= deadline)); then
            fail_start "$name" "$logf" "not ready within ${TIMEOUT_S} s (check: $*)"
        fi
        sleep 0.2
    done
}

alive() {  # alive PID -> 0 while PID exists and is not a zombie
    [[ -r "/proc/$1/status" ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

stop_pid() {  # stop_pid NAME PID [SIGNAL]: send SIGNAL (TERM), wait up to 20 s, then SIGKILL
    local name="$1" pid="$2" sig="${3:-TERM}" i
    kill -"$sig" "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 100; i++)); do
        alive "$pid" || return 0
        sleep 0.2
    done
    say "$name (PID $pid) ignored SIG$sig for 20 s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 25; i++)); do alive "$pid" || return 0; sleep 0.2; done
    say "warning: $name (PID $pid) still alive"
}

stepd_pids() {  # PIDs of slurmstepd processes of DIR's slurmd (they hold DIR/log/slurmd.log open)
    local p fd comm
    for p in /proc/[0-9]*; do
        { read -r comm <"$p/comm"; } 2>/dev/null || continue
        [[ "$comm" == slurmstepd ]] || continue
        for fd in "$p"/fd/*; do
            if [[ "$(readlink "$fd" 2>/dev/null)" == "$DIR/log/slurmd.log" ]]; then
                echo "${p#/proc/}"
                break
            fi
        done
    done
}

children_of() {  # children_of PID -> its child PIDs, from /proc/*/stat ("pid (comm) state ppid ...")
    local f line
    for f in /proc/[0-9]*/stat; do
        { read -r line <"$f"; } 2>/dev/null || continue
        line="${line##*) }"  # "state ppid ..." (comm may hold spaces and parentheses)
        line="${line#* }"
        if [[ "${line%% *}" == "$1" ]]; then f="${f#/proc/}"; echo "${f%/stat}"; fi
    done
}

kill_tree() {  # kill_tree PID: SIGKILL PID and all its descendants (leftovers of dead jobs)
    local child
    for child in $(children_of "$1"); do kill_tree "$child"; done
    stop_pid "PID $1" "$1" KILL
}

# ---------------------------------------------------------------------------------------------

free_ports() {  # free_ports N -> N distinct TCP ports with no listener, from the dynamic range
    local n="$1" p listening=" " picked=" " sl local rem st
    # /proc/net/tcp: "sl local_address(hex ip:hex port) rem_address st(0A = LISTEN) ..."
    while read -r sl local rem st _; do
        if [[ "$st" == 0A ]]; then listening+="$((16#${local##*:})) "; fi
    done < <(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null)
    while ((n > 0)); do
        p=$((20000 + (RANDOM * 32768 + RANDOM) % 30000))
        [[ "$listening" == *" $p "* || "$picked" == *" $p "* ]] && continue
        picked+="$p "
        n=$((n - 1))
    done
    echo $picked
}

install_if_missing() {
    local b missing=()
    for b in "${BINARIES[@]}"; do command -v "$b" >/dev/null || missing+=("$b"); done
    ((${#missing[@]} == 0)) && return 0
    command -v apt-get >/dev/null ||
        die_install "missing ${missing[*]} and no apt-get to install ${PACKAGES[*]}"
    say "installing ${PACKAGES[*]} (missing: ${missing[*]}) ..."
    # Debian's postinst scripts would start system-wide munge/mariadb/slurm services; a
    # policy-rc.d that answers 101 keeps them down (docker images ship one already).
    local made_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    local t0=$SECONDS rc=0
    local apt=(apt-get -o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-confdef
               -o Dpkg::Options::=--force-confold install -y --no-install-recommends "${PACKAGES[@]}")
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" >&2 ||
        { apt-get -o DPkg::Lock::Timeout=300 update >&2 && DEBIAN_FRONTEND=noninteractive "${apt[@]}" >&2; } ||
        rc=$?
    if ((made_policy)); then rm -f /usr/sbin/policy-rc.d; fi
    ((rc == 0)) || die_install "apt-get install ${PACKAGES[*]} failed (exit $rc)"
    say "installed in $((SECONDS - t0)) s"
}

write_config() {  # write_config HOST: slurm.conf, slurmdbd.conf, gres.conf, fake GPU devices
    local host="$1" node_line cpus
    read -r P_MYSQL P_DBD P_CTLD P_SLURMD <<<"$(free_ports 4)"
    DB_PASS="$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"

    # node shape as slurmd sees it, RealMemory at 90% so the node is never drained for memory
    node_line="$(slurmd -C)"
    node_line="${node_line%%$'\n'*}"
    local kv key val shape="" realmem=0
    for kv in $node_line; do
        key="${kv%%=*}"; val="${kv#*=}"
        case "$key" in
            CPUs | Boards | SocketsPerBoard | CoresPerSocket | ThreadsPerCore) shape+=" $key=$val" ;;
            RealMemory) realmem=$((val * 9 / 10)) ;;
        esac
        if [[ "$key" == CPUs ]]; then cpus="$val"; fi
    done
    [[ -n "${cpus:-}" && "$realmem" -gt 0 ]] || die "cannot parse 'slurmd -C' output: $node_line"

    local i gres_line="" node_gres=""
    rm -rf "$DIR/dev" && mkdir -p "$DIR/dev"
    if ((GPUS > 0)); then
        for ((i = 0; i < GPUS; i++)); do
            # GRES File= must be a character device; 1,3 is /dev/null's (major, minor)
            mknod "$DIR/dev/fakegpu$i" c 1 3 2>/dev/null || ln -s /dev/null "$DIR/dev/fakegpu$i"
        done
        gres_line="NodeName=$host Name=gpu File=$DIR/dev/fakegpu[0-$((GPUS - 1))]"
        node_gres="Gres=gpu:$GPUS"
    fi

    cat >"$DIR/etc/slurm.conf" <<EOF
# Written by slurm/dev-cluster.sh for $DIR; regenerated by every fresh \`up\`.
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$P_CTLD
SlurmdPort=$P_SLURMD
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also sets how long a requeued job waits before it may start again (default 120 s)
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=10
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/d
SlurmctldPidFile=$DIR/spool/slurmctld.pid
SlurmdPidFile=$DIR/spool/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$DIR/etc/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1,batch_sched_delay=0,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
# requeue: allowed for batch jobs; partition "urgent" preempts partition "$PARTITION" by requeue
JobRequeue=1
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
KillWait=2
MinJobAge=60
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
MessageTimeout=10
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$P_DBD
AccountingStoragePass=$DIR/munge/munge.socket
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/none
NodeName=$host NodeAddr=127.0.0.1$shape RealMemory=$realmem $node_gres State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE
PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
EOF

    cat >"$DIR/etc/slurmdbd.conf" <<EOF
# Written by slurm/dev-cluster.sh for $DIR.
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
DbdHost=$host
DbdAddr=127.0.0.1
DbdPort=$P_DBD
# undocumented for slurmdbd in 22.05 but honoured: bind to DbdHost's address, not 0.0.0.0
CommunicationParameters=NoInAddrAny
SlurmUser=root
LogFile=$DIR/log/slurmdbd.log
PidFile=$DIR/spool/slurmdbd.pid
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$P_MYSQL
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
    chmod 0600 "$DIR/etc/slurmdbd.conf"   # slurmdbd refuses a readable file (it holds a password)
    echo "$gres_line" >"$DIR/etc/gres.conf"
    : >"$DIR/etc/plugstack.conf"
    echo "$P_MYSQL" >"$DIR/run/mysql.port"
}

client_env() {
    echo "export SLURM_CONF=$DIR/etc/slurm.conf"
}

all_running() {
    local d
    for d in "${DAEMONS[@]}"; do daemon_pid "$d" >/dev/null || return 1; done
}

any_running() {
    local d
    for d in "${DAEMONS[@]}"; do daemon_pid "$d" >/dev/null && return 0; done
    return 1
}

check_knobs() {  # bad input fails here, before anything is installed or started
    [[ "$GPUS" =~ ^[0-9]+$ ]] && ((GPUS <= 64)) ||
        die "DEV_CLUSTER_GPUS='$GPUS': allowed values are integers 0..64 (fake GPUs on the node)"
    [[ "$PARTITION" =~ ^[a-z][a-z0-9_-]{0,30}$ && "$PARTITION" != urgent ]] ||
        die "DEV_CLUSTER_PARTITION='$PARTITION': allowed values are [a-z][a-z0-9_-]{0,30}, not 'urgent' (the preempting partition)"
    [[ "$TIMEOUT_S" =~ ^[1-9][0-9]*$ ]] ||
        die "DEV_CLUSTER_TIMEOUT_S='$TIMEOUT_S': allowed values are positive integers (seconds per readiness wait)"
}

do_up() {
    ((EUID == 0)) || die "must run as root (slurmd launches jobs; apt-get installs packages)"
    if all_running; then
        say "already running in $DIR"
        client_env
        return 0
    fi
    any_running && die "some daemons of $DIR are running and some are not ($(do_status 2>&1 | tr '\n' ' ')); run 'down $DIR' first"
    install_if_missing
    local t0=$SECONDS host sock
    host="$(hostname -s)"
    mkdir -p "$DIR"/{etc,log,run,spool/ctld,spool/d,mysql,tmp}
    # unix socket paths are limited to 107 bytes; slurmd puts NODE_JOBID.STEPID sockets in its spool
    sock="$DIR/spool/d/${host}_4294967290.4294967290"
    ((${#sock} < 107)) || die "DIR is too long for unix socket paths (${#sock} >= 107 bytes): $DIR"
    rm -f "$DIR"/run/*.pid
    write_config "$host"
    export SLURM_CONF="$DIR/etc/slurm.conf"

    # munge: private key and socket; the socket directory must be mode 755
    mkdir -p "$DIR/munge" && chmod 0755 "$DIR/munge"
    if [[ ! -s "$DIR/munge/munge.key" ]]; then
        mungekey --create --keyfile="$DIR/munge/munge.key" --force 2>/dev/null ||
            dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
    fi
    chmod 0600 "$DIR/munge/munge.key"
    start_daemon munged munged --foreground --force --socket="$DIR/munge/munge.socket" \
        --key-file="$DIR/munge/munge.key" --log-file="$DIR/log/munged.log" \
        --pid-file="$DIR/munge/munged.pid" --seed-file="$DIR/munge/munged.seed"
    wait_for munged "$DIR/log/munged.log" \
        bash -c 'munge -n -S "$1" | unmunge -S "$1"' _ "$DIR/munge/munge.socket"
    say "munged up ($((SECONDS - t0)) s)"

    # MariaDB on 127.0.0.1:P_MYSQL, its own data directory, no system option files
    local my=(--no-defaults --user=root --datadir="$DIR/mysql/data" --socket="$DIR/mysql/mysqld.sock")
    if [[ ! -d "$DIR/mysql/data/mysql" ]]; then
        mariadb-install-db "${my[@]}" --auth-root-authentication-method=socket --skip-test-db \
            >>"$DIR/log/mariadb-install.log" 2>&1 ||
            fail_start mariadbd "$DIR/log/mariadb-install.log" "database initialisation failed"
    fi
    start_daemon mariadbd mariadbd "${my[@]}" --port="$P_MYSQL" --bind-address=127.0.0.1 \
        --skip-name-resolve --pid-file="$DIR/mysql/mariadbd.pid" --log-error="$DIR/log/mariadb.log" \
        --tmpdir="$DIR/tmp" --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 \
        --innodb-flush-log-at-trx-commit=2 --skip-log-bin
    wait_for mariadbd "$DIR/log/mariadb.log" \
        mariadb --no-defaults --socket="$DIR/mysql/mysqld.sock" -uroot -e 'SELECT 1'
    mariadb --no-defaults --socket="$DIR/mysql/mysqld.sock" -uroot <<EOF ||
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
EOF
        fail_start mariadbd "$DIR/log/mariadb.log" "did not accept the slurm user"
    say "mariadb up ($((SECONDS - t0)) s)"

    start_daemon slurmdbd slurmdbd -D
    wait_for slurmdbd "$DIR/log/slurmdbd.log" sacctmgr -n show cluster
    if [[ -z "$(sacctmgr -n -P show cluster format=cluster where cluster="$CLUSTER")" ]]; then
        sacctmgr -i add cluster "$CLUSTER" >/dev/null ||
            fail_start slurmdbd "$DIR/log/slurmdbd.log" "refused 'sacctmgr add cluster $CLUSTER'"
    fi
    say "slurmdbd up, cluster '$CLUSTER' registered ($((SECONDS - t0)) s)"

    # A fresh controller state (-c): `down` ended every job, so restored "running" jobs would be
    # ghosts. Job ids continue after the last one in accounting, so sacct never mixes two jobs.
    local last_id
    last_id="$(sacct -a -X -n -P -o JobIDRaw -S 2000-01-01 -E now 2>/dev/null | sort -n | tail -n 1)" ||
        last_id=""
    [[ "$last_id" =~ ^[0-9]+$ ]] || last_id=0
    echo "FirstJobId=$((${last_id:-0} + 1))" >>"$DIR/etc/slurm.conf"
    start_daemon slurmctld slurmctld -D -c
    wait_for slurmctld "$DIR/log/slurmctld.log" bash -c 'scontrol ping | grep -q "is UP"'
    say "slurmctld up ($((SECONDS - t0)) s)"

    start_daemon slurmd slurmd -D -N "$host"
    # registered and usable: idle, or busy if a client already submitted (env.sh is not yet out)
    wait_for slurmd "$DIR/log/slurmd.log" \
        bash -c '[[ "$(sinfo -h -n "$1" -o %T)" =~ ^(idle|mixed|allocated|completing)$ ]]' _ "$host"
    say "slurmd up, node $host $(sinfo -h -n "$host" -o %T) ($((SECONDS - t0)) s)"

    client_env >"$DIR/env.sh"
    say "cluster running in $DIR (partition '$PARTITION', $GPUS fake GPUs); up took $((SECONDS - t0)) s"
    client_env
}

do_down() {
    local t0=$SECONDS d pid p
    [[ -d "$DIR" ]] || die "no such directory: $DIR"
    if daemon_pid slurmctld >/dev/null; then
        # end this cluster's jobs first, so that no job step outlives its slurmd
        local jobs
        jobs="$(SLURM_CONF="$DIR/etc/slurm.conf" squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ')" ||
            jobs=""  # a controller that is shutting down does not answer
        if [[ -n "${jobs// /}" ]]; then
            say "cancelling jobs $jobs"
            # shellcheck disable=SC2086
            SLURM_CONF="$DIR/etc/slurm.conf" scancel --quiet $jobs 2>/dev/null || true
        fi
        local deadline=$((SECONDS + 10))
        while [[ -n "$(SLURM_CONF="$DIR/etc/slurm.conf" squeue -h -o %i 2>/dev/null)" ]] &&
            ((SECONDS < deadline)); do sleep 0.2; done
    fi
    # job steps whose job could not be cancelled (no controller): slurmstepd overwrites its
    # environment with its title, but it keeps slurmd's log file open
    for pid in $(stepd_pids); do
        say "stopping leftover slurmstepd (PID $pid) and its job's processes"
        kill_tree "$pid"
    done
    for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
        d="${DAEMONS[i]}"
        if pid="$(daemon_pid "$d")"; then
            stop_pid "$d" "$pid"
        fi
    done
    # anything else started with DIR's marker (e.g. a helper a daemon forked)
    for p in $(grep -lzxF "DEV_CLUSTER_DIR=$DIR" /proc/[0-9]*/environ 2>/dev/null || true); do
        pid="${p#/proc/}" && pid="${pid%/environ}"
        say "stopping leftover process (PID $pid) and its children"
        kill_tree "$pid"
    done
    say "stopped $DIR in $((SECONDS - t0)) s (logs kept in $DIR/log)"
}

do_status() {
    local d pid rc=0
    for d in "${DAEMONS[@]}"; do
        if pid="$(daemon_pid "$d")"; then echo "$d running (PID $pid)"; else echo "$d stopped"; rc=1; fi
    done
    return $rc
}

(($# == 2)) || usage
DIR="$2"
[[ "$DIR" == /* ]] || DIR="$PWD/$DIR"
DIR="${DIR%/}"
case "$1" in
    up) check_knobs && mkdir -p "$DIR" && DIR="$(cd "$DIR" && pwd -P)" && do_up ;;
    down) DIR="$(cd "$DIR" 2>/dev/null && pwd -P)" || die "no such directory: $2"; do_down ;;
    status) DIR="$(cd "$DIR" 2>/dev/null && pwd -P)" || die "no such directory: $2"; do_status ;;
    env) DIR="$(cd "$DIR" 2>/dev/null && pwd -P)" || die "no such directory: $2"
         all_running || die "cluster in $DIR is not running"; client_env ;;
    *) usage ;;
esac
