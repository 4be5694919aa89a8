#!/usr/bin/env bash
# A cluster of hosts on this one machine, with real daemons, for the multi-host tests
# and for trying a launcher by hand. Needs root, iproute2, util-linux (unshare,
# nsenter) and openssh-server.
#
#   scripts/test-cluster.sh up DIR [HOSTS] [--slurm]
#                                              start HOSTS hosts (default 3), state in DIR
#   scripts/test-cluster.sh exec DIR I CMD...  run CMD on host I (its network, its name)
#   scripts/test-cluster.sh stop-sshd DIR I    stop host I's sshd (a host that refuses)
#   scripts/test-cluster.sh down DIR           stop everything, remove what `up` wrote
#   scripts/test-cluster.sh sweep              take down test clusters whose owner has died
#   scripts/test-cluster.sh sshd-in DIR NETNS=ADDR...
#                                              an sshd in each of these namespaces (made
#                                              by the caller, who also ends them), keys
#                                              and ssh_config in DIR
#
# Host I is a network namespace with its own UTS namespace (host name nodeI), its own
# mount namespace (where /etc/hosts names every host, so names resolve as on a real
# cluster) and the address 10.79.0.(I+1)/24 on eth0, a veth pair to a bridge in a
# namespace of its own, so nothing touches the machine's own network or files. Every
# host runs sshd on port 22 (Debian's openssh-server, its own config and keys in DIR,
# root login by key only).
#
# With --slurm (Debian's slurmctld, slurmd and munge): a munged of the cluster's own
# (its own key and socket in DIR), slurmctld on node0 and slurmd on every host, one
# partition `test` of every host (4 CPUs each), state and logs in DIR/slurm. Slurm's
# commands find it with SLURM_CONF=DIR/slurm/slurm.conf.
#
# `up` writes into DIR:
#   ssh_config   `ssh -F DIR/ssh_config nodeI` logs in to host I (names, key, no
#                host-key prompts); `switchyard launch --launcher ssh --launcher-args "-F DIR/ssh_config"`
#   hostfile     one host name per line, node0 first
#   hosts        the /etc/hosts every host sees
#   owner        (test clusters only) the PID of the test process that owns it
# and nothing else: DIR may hold files of its own, but none of the names above, nor
# hostfile, host_key*, user_key*, authorized_keys, sshd-node*, slurm/, munge/ or
# munge-socket/ (`up` refuses).
#
# A cluster is a test's when its caller sets SYC_OWNER (the test process's PID;
# SYC_TAG=syc<owner>x<n> names the cluster for callers that start several at once):
# once that process has died, the next `up` or `sweep` takes the cluster down. A
# cluster brought up by hand (no SYC_OWNER) is never swept: it runs until `down`.
#
# `down` kills every process inside the hosts' namespaces (the daemons and whatever
# was started through them) and the cluster's munged, deletes the namespaces, unmounts
# the name and mount namespaces and removes what `up` wrote into DIR (DIR itself only
# if `up` made it and it is left empty): nothing stays running or mounted, and the
# user's own files in DIR stay. It is safe to call twice. An `up` that fails (or is
# interrupted) takes down what it had made the same way.
#
# Nothing here sends a packet outside the namespaces: the only daemon outside them,
# munged, is given its origin address rather than looking its host name up.
set -euo pipefail

SUBNET=10.79.0
STATE_ROOT=/run/switchyard-cluster

die() {
    echo "test-cluster: $*" >&2
    exit 1
}

# The tag that names a cluster's namespaces: syc<owner pid>x<counter> for a test's,
# sycm<counter> for one brought up by hand.
tag_of() { cat "$1/tag"; }

# What `up` writes into DIR (globs), and `down` removes: nothing else there is ours.
MADE_BY_UP="tag owner dir dir-made hosts hostfile ssh_config host_key host_key.pub
user_key user_key.pub authorized_keys sshd-node*.pid sshd-node*.log slurm munge
munge-socket"

# The start time of process PID (field 22 of /proc/PID/stat, read after the command
# name, which may hold spaces), empty if it is gone: a PID and its start time name one
# process, even after the PID is reused.
start_time() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    stat=${stat##*) }
    echo "$stat" | cut -d' ' -f20
}
host_ns() { echo "$(tag_of "$1")h$2"; }
# The folder that holds the cluster's persistent name and mount namespaces: a private
# mount of its own (a mount namespace can be bound to a file only off shared mounts).
ns_dir() { echo "$STATE_ROOT/$(tag_of "$1")/ns"; }
host_uts() { echo "$(ns_dir "$1")/uts$2"; }
host_mnt() { echo "$(ns_dir "$1")/mnt$2"; }

# nsenter's arguments for host I (no spaces in them: checked in `up`).
host_enter() {
    echo "--net=/run/netns/$(host_ns "$1" "$2")" "--uts=$(host_uts "$1" "$2")" "--mount=$(host_mnt "$1" "$2")"
}

# Runs CMD on host I.
on_host() {
    local dir=$1 i=$2
    shift 2
    # shellcheck disable=SC2046
    nsenter $(host_enter "$dir" "$i") "$@"
}

up() {
    local dir=$1 hosts=${2:-3} slurm=${3:-}
    [ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
    command -v /usr/sbin/sshd >/dev/null || die "needs sshd (apt install openssh-server)"
    command -v nsenter >/dev/null || die "needs nsenter (util-linux)"
    [ "$hosts" -ge 1 ] && [ "$hosts" -le 200 ] || die "1 to 200 hosts, not $hosts"
    [ -e "$dir/tag" ] && die "$dir already holds a cluster; take it down first"
    if [ "$slurm" = --slurm ]; then
        for daemon in slurmctld slurmd munged; do
            [ -x "/usr/sbin/$daemon" ] || die "--slurm needs /usr/sbin/$daemon (apt install slurmctld slurmd munge)"
        done
    fi
    local made_dir=
    if [ -d "$dir" ]; then
        # `down` removes these names: they must not be the user's.
        local name
        for name in $(cd "$dir" && echo $MADE_BY_UP); do
            [ -e "$dir/$name" ] && die "$dir/$name exists, and up would write it (and down remove it): use another DIR"
        done
    else
        made_dir=1
    fi
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    case "$dir" in *[[:space:]]*) die "DIR must have no spaces: $dir" ;; esac
    local owner=${SYC_OWNER:-} tag
    if [ -n "${SYC_TAG:-}" ]; then
        # A caller that starts several clusters at once names each (syc<owner>x<n>).
        tag=$SYC_TAG
        [ -n "$owner" ] || die "SYC_TAG needs SYC_OWNER"
        case "$tag" in "syc${owner}x"*) ;; *) die "SYC_TAG must start with syc${owner}x" ;; esac
    else
        local prefix=sycm n=0
        [ -n "$owner" ] && prefix="syc${owner}x"
        while ip netns list | grep -qE "^${prefix}${n}(h[0-9]+|br)$" || [ -e "$STATE_ROOT/${prefix}${n}" ]; do
            n=$((n + 1))
        done
        tag="${prefix}${n}"
    fi
    echo "$tag" >"$dir/tag"
    [ -n "$made_dir" ] && : >"$dir/dir-made"
    echo "$dir" >"$dir/dir"
    # From here on a failure (a failed command in any function, `die`, an interrupt)
    # takes down what was made: an EXIT trap, which `exit` and `set -e` both run (an
    # ERR trap is not inherited by functions, and `die` is no error).
    trap "down $(printf %q "$dir") >/dev/null 2>&1 || true" EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    mkdir -p "$STATE_ROOT/$tag/ns" /run/sshd
    echo "$dir" >"$STATE_ROOT/$tag/dir"
    if [ -n "$owner" ]; then
        echo "$owner" >"$dir/owner"
        echo "$owner $(start_time "$owner")" >"$STATE_ROOT/$tag/test-owner"
    fi
    mount --bind "$STATE_ROOT/$tag/ns" "$STATE_ROOT/$tag/ns"
    mount --make-private "$STATE_ROOT/$tag/ns"
    {
        echo "127.0.0.1 localhost"
        local h
        for ((h = 0; h < hosts; h++)); do echo "$SUBNET.$((h + 1)) node$h"; done
    } >"$dir/hosts"

    local bridge="${tag}br"
    ip netns add "$bridge"
    ip -n "$bridge" link set lo up
    ip -n "$bridge" link add br0 type bridge
    ip -n "$bridge" link set br0 up

    ssh_keys "$dir" 'node*'
    : >"$dir/hostfile"
    local i
    for ((i = 0; i < hosts; i++)); do
        local ns addr
        ns=$(host_ns "$dir" "$i")
        addr="$SUBNET.$((i + 1))"
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip -n "$ns" link add eth0 type veth peer name "h$i" netns "$bridge"
        ip -n "$bridge" link set "h$i" master br0
        ip -n "$bridge" link set "h$i" up
        ip -n "$ns" addr add "$addr/24" dev eth0
        ip -n "$ns" link set eth0 up
        # A default route, as real hosts have (a job's address is chosen by it);
        # the gateway does not exist.
        ip -n "$ns" route add default via "$SUBNET.254" dev eth0
        # Name and mount namespaces that outlive their processes, bound to files.
        touch "$(host_uts "$dir" "$i")" "$(host_mnt "$dir" "$i")"
        unshare --uts="$(host_uts "$dir" "$i")" hostname "node$i"
        unshare --mount="$(host_mnt "$dir" "$i")" --propagation private \
            mount --bind "$dir/hosts" /etc/hosts
        printf 'Host node%s\n    HostName %s\n' "$i" "$addr" >>"$dir/ssh_config"
        echo "node$i" >>"$dir/hostfile"
        # shellcheck disable=SC2046
        start_sshd "$dir" "node$i" "$addr" nsenter $(host_enter "$dir" "$i")
    done
    wait_sshd "$dir" "$hosts"
    if [ "$slurm" = --slurm ]; then start_slurm "$dir" "$hosts"; fi
    trap - EXIT INT TERM
}

# munged (outside the namespaces: its socket is a path every host sees), then
# slurmctld on node0 and slurmd on every host; waits until every node is idle.
start_slurm() {
    local dir=$1 hosts=$2
    local s="$dir/slurm" i
    mkdir -p "$s/state" "$s/spool" "$dir/munge" "$dir/munge-socket"
    # munged insists on its own user owning its key and folders, and on a socket
    # folder everyone may enter.
    chown munge:munge "$dir/munge" "$dir/munge-socket"
    chmod 700 "$dir/munge"
    chmod 755 "$dir/munge-socket"
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chown munge:munge "$dir/munge/munge.key"
    chmod 400 "$dir/munge/munge.key"
    # --origin: by address, so that munged does not look this machine's name up (a
    # DNS query from outside the namespaces when /etc/hosts lacks it).
    runuser -u munge -- /usr/sbin/munged \
        --origin=127.0.0.1 \
        --socket="$dir/munge-socket/munge.sock" \
        --key-file="$dir/munge/munge.key" \
        --pid-file="$dir/munge/munged.pid" \
        --log-file="$dir/munge/munged.log" \
        --seed-file="$dir/munge/munged.seed"
    {
        echo "# Written by scripts/test-cluster.sh for the cluster in $dir."
        echo "ClusterName=switchyard-test"
        echo "SlurmctldHost=node0($SUBNET.1)"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "AuthType=auth/munge"
        echo "AuthInfo=socket=$dir/munge-socket/munge.sock"
        echo "CredType=cred/munge"
        echo "StateSaveLocation=$s/state"
        echo "SlurmdSpoolDir=$s/spool/%n"
        echo "SlurmctldPidFile=$s/slurmctld.pid"
        echo "SlurmdPidFile=$s/slurmd-%n.pid"
        echo "SlurmctldLogFile=$s/slurmctld.log"
        echo "SlurmdLogFile=$s/slurmd-%n.log"
        echo "# No cgroups: the hosts share this machine's; processes are tracked by parentage."
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "SwitchType=switch/none"
        echo "MpiDefault=none"
        echo "ReturnToService=2"
        echo "SchedulerType=sched/builtin"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_CPU"
        echo "# 4 CPUs a host, whatever this machine has."
        echo "SlurmdParameters=config_overrides"
        # (Single quotes inside: backquotes in double quotes would run sacct here.)
        echo "# Job completions in a file, read by 'sacct --completion' (no accounting database)."
        echo "JobCompType=jobcomp/filetxt"
        echo "JobCompLoc=$s/jobcomp.txt"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "KillWait=3"
        echo "MinJobAge=300"
        echo "SlurmctldTimeout=30"
        echo "SlurmdTimeout=30"
        for ((i = 0; i < hosts; i++)); do
            echo "NodeName=node$i NodeAddr=$SUBNET.$((i + 1)) CPUs=4 State=UNKNOWN"
        done
        echo "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
    } >"$s/slurm.conf"
    on_host "$dir" 0 /usr/sbin/slurmctld -f "$s/slurm.conf" -i
    for ((i = 0; i < hosts; i++)); do
        on_host "$dir" "$i" /usr/sbin/slurmd -f "$s/slurm.conf" -N "node$i"
    done
    local tries idle
    for ((tries = 0; ; tries++)); do
        idle=$(SLURM_CONF="$s/slurm.conf" on_host "$dir" 0 sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
        [ "$idle" -eq "$hosts" ] && break
        if [ "$tries" -ge 100 ]; then
            tail -n 5 "$s/slurmctld.log" >&2 || true
            die "Slurm: $idle of $hosts nodes idle after 20 s"
        fi
        sleep 0.2
    done
}

# The keys and the client configuration of the logins to hosts whose names match
# PATTERN: the host key every sshd uses, the one user key it takes, and an
# ssh_config with them (no host-key prompts).
ssh_keys() {
    local dir=$1 pattern=$2
    ssh-keygen -q -t ed25519 -N '' -C switchyard-test-cluster -f "$dir/host_key"
    ssh-keygen -q -t ed25519 -N '' -C switchyard-test-cluster -f "$dir/user_key"
    cp "$dir/user_key.pub" "$dir/authorized_keys"
    chmod 600 "$dir/authorized_keys" "$dir/user_key" "$dir/host_key"
    {
        echo "# Written by scripts/test-cluster.sh in $dir."
        echo "Host $pattern"
        echo "    User root"
        echo "    IdentityFile $dir/user_key"
        echo "    IdentitiesOnly yes"
        echo "    StrictHostKeyChecking no"
        echo "    UserKnownHostsFile /dev/null"
        echo "    LogLevel ERROR"
    } >"$dir/ssh_config"
}

# Starts sshd for host NAME listening on ADDR, run by ENTER... (the command that
# enters the host's namespaces); its pid in DIR/sshd-NAME.pid, its log beside.
start_sshd() {
    local dir=$1 name=$2 addr=$3
    shift 3
    mkdir -p /run/sshd
    "$@" /usr/sbin/sshd -f /dev/null \
        -h "$dir/host_key" \
        -o "ListenAddress=$addr" \
        -o "PidFile=$dir/sshd-$name.pid" \
        -o "AuthorizedKeysFile=$dir/authorized_keys" \
        -o PermitRootLogin=prohibit-password \
        -o PasswordAuthentication=no \
        -o KbdInteractiveAuthentication=no \
        -o StrictModes=no \
        -o UsePAM=no \
        -o MaxStartups=100 \
        -o MaxSessions=100 \
        -E "$dir/sshd-$name.log"
}

# Gives network namespaces made elsewhere (the tests' own hosts) an sshd each:
# NETNS=ADDR pairs; the client configuration covers every host (Host *), by address.
sshd_in() {
    local dir=$1 pair ns addr tries
    shift
    mkdir -p "$dir"
    ssh_keys "$dir" '*'
    for pair in "$@"; do
        ns=${pair%%=*}
        addr=${pair#*=}
        start_sshd "$dir" "$addr" "$addr" ip netns exec "$ns"
    done
    for pair in "$@"; do
        ns=${pair%%=*}
        addr=${pair#*=}
        for ((tries = 0; ; tries++)); do
            ip netns exec "$ns" ssh -F "$dir/ssh_config" -o BatchMode=yes \
                -o ConnectTimeout=2 "$addr" true 2>/dev/null && break
            [ "$tries" -lt 150 ] || die "sshd at $addr in $ns did not answer within 30 s"
            sleep 0.2
        done
    done
}

# Every host answers a login within 30 s (sshd starts in well under a second on an
# idle machine; a loaded one has been seen to take over 10), or `up` fails naming it.
wait_sshd() {
    local dir=$1 hosts=$2 i tries
    for ((i = 0; i < hosts; i++)); do
        for ((tries = 0; ; tries++)); do
            if on_host "$dir" 0 ssh -F "$dir/ssh_config" -o BatchMode=yes \
                -o ConnectTimeout=2 "node$i" true 2>/dev/null; then
                break
            fi
            if [ "$tries" -ge 150 ]; then
                down "$dir" >/dev/null 2>&1 || true
                die "sshd on node$i did not answer within 30 s (see its log above)"
            fi
            sleep 0.2
        done
    done
}

# Kills every process in namespace NS (deleting a namespace does not end them).
kill_in_ns() {
    local ns=$1 pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
}

down() {
    local dir=$1
    [ -e "$dir/tag" ] || return 0
    local tag
    tag=$(tag_of "$dir")
    local ns pid
    pid=$(cat "$dir/munge/munged.pid" 2>/dev/null || true)
    if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; fi
    # Every process first (twice: something may have been starting), then namespaces.
    for _ in 1 2; do
        for ns in $(ip netns list | awk '{print $1}' | grep -E "^${tag}h[0-9]+$" || true); do
            kill_in_ns "$ns"
        done
        sleep 0.1
    done
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^${tag}(h[0-9]+|br)$" || true); do
        ip netns del "$ns" 2>/dev/null || true
    done
    unmount_state "$STATE_ROOT/$tag"
    remove_made "$dir"
}

# Removes what `up` wrote into DIR, and DIR if `up` made it and nothing else is left.
remove_made() {
    local dir=$1 name made_dir=
    [ -e "$dir/dir-made" ] && made_dir=1
    for name in $(cd "$dir" && echo $MADE_BY_UP); do
        rm -rf "${dir:?}/$name"
    done
    if [ -n "$made_dir" ]; then rmdir "$dir" 2>/dev/null || true; fi
}

# Unmounts a cluster's namespace files and their folder, and removes its state.
unmount_state() {
    local state=$1 file
    for file in "$state"/ns/*; do
        [ -e "$file" ] || continue
        umount "$file" 2>/dev/null || true
    done
    umount "$state/ns" 2>/dev/null || true
    rm -rf "$state"
}

# Test clusters whose owner process no longer runs (a PID now running another
# process counts as dead). Clusters brought up by hand have no test owner: left alone.
sweep() {
    local state owner start dir
    for state in "$STATE_ROOT"/syc*; do
        [ -d "$state" ] || continue
        [ -r "$state/test-owner" ] || continue
        read -r owner start <"$state/test-owner" || true
        [ -n "${owner:-}" ] || continue
        if [ -n "${start:-}" ] && [ "$(start_time "$owner")" = "$start" ]; then continue; fi
        dir=$(cat "$state/dir" 2>/dev/null || true)
        if [ -n "$dir" ] && [ -e "$dir/tag" ]; then
            down "$dir"
        else
            # The state folder outlived its cluster folder: clean by tag.
            local tag=${state##*/} ns
            for ns in $(ip netns list | awk '{print $1}' | grep -E "^${tag}(h[0-9]+|br)$" || true); do
                kill_in_ns "$ns"
                ip netns del "$ns" 2>/dev/null || true
            done
            unmount_state "$state"
        fi
    done
}

case "${1:-}" in
up)
    [ $# -ge 2 ] || die "usage: $0 up DIR [HOSTS] [--slurm]"
    sweep
    up "$2" "${3:-3}" "${4:-}"
    ;;
exec)
    [ $# -ge 4 ] || die "usage: $0 exec DIR I CMD..."
    dir=$2 i=$3
    shift 3
    # shellcheck disable=SC2046
    exec nsenter $(host_enter "$dir" "$i") "$@"
    ;;
stop-sshd)
    [ $# -eq 3 ] || die "usage: $0 stop-sshd DIR I"
    kill -TERM "$(cat "$2/sshd-node$3.pid")"
    ;;
down)
    [ $# -eq 2 ] || die "usage: $0 down DIR"
    down "$2"
    ;;
sweep)
    sweep
    ;;
sshd-in)
    [ $# -ge 3 ] || die "usage: $0 sshd-in DIR NETNS=ADDR..."
    [ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
    dir=$2
    shift 2
    sshd_in "$dir" "$@"
    ;;
*)
    die "usage: $0 up DIR [HOSTS] [--slurm] | exec DIR I CMD... | stop-sshd DIR I | down DIR | sweep | sshd-in DIR NETNS=ADDR..."
    ;;
esac
