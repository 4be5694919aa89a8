#!/usr/bin/env bash
# A cluster of hosts on this one machine, with real daemons, for the multi-host tests
# and for trying a launcher by hand. Needs root, iproute2, util-linux (unshare,
# nsenter) and openssh-server.
#
#   scripts/test-cluster.sh up DIR [HOSTS]     start HOSTS hosts (default 3), state in DIR
#   scripts/test-cluster.sh exec DIR I CMD...  run CMD on host I (its network, its name)
#   scripts/test-cluster.sh stop-sshd DIR I    stop host I's sshd (a host that refuses)
#   scripts/test-cluster.sh down DIR           stop everything, remove DIR
#   scripts/test-cluster.sh sweep              take down clusters whose owner has died
#
# Host I is a network namespace with its own UTS namespace (host name nodeI) and the
# address 10.79.0.(I+1)/24 on eth0, a veth pair to a bridge in a namespace of its own,
# so nothing touches the machine's own network. Every host runs sshd on port 22
# (Debian's openssh-server, its own config and keys in DIR, root login by key only).
#
# `up` writes into DIR:
#   ssh_config   `ssh -F DIR/ssh_config nodeI` logs in to host I (names, key, no
#                host-key prompts); `switchyard launch --ssh-args "-F DIR/ssh_config"`
#   hostfile     one host name per line, node0 first
#   owner        the PID whose death lets `sweep` take the cluster down (SYC_OWNER,
#                default the caller's PID; SYC_TAG=syc<owner>x<n> names the cluster
#                for callers that start several at once)
#
# `down` kills every process inside the hosts' namespaces (sshd and whatever was
# started through it), deletes the namespaces, unmounts the name namespaces and
# removes DIR: nothing stays running or mounted. It is safe to call twice.
set -euo pipefail

SUBNET=10.79.0
STATE_ROOT=/run/switchyard-cluster

die() {
    echo "test-cluster: $*" >&2
    exit 1
}

# The tag that names a cluster's namespaces: syc<owner pid>x<counter>.
tag_of() { cat "$1/tag"; }
host_ns() { echo "$(tag_of "$1")h$2"; }
host_uts() { echo "$STATE_ROOT/$(tag_of "$1")/uts$2"; }

# Runs CMD in host I's network and name namespaces.
on_host() {
    local dir=$1 i=$2
    shift 2
    nsenter --net="/run/netns/$(host_ns "$dir" "$i")" --uts="$(host_uts "$dir" "$i")" "$@"
}

up() {
    local dir=$1 hosts=${2:-3}
    [ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
    command -v /usr/sbin/sshd >/dev/null || die "needs sshd (apt install openssh-server)"
    command -v nsenter >/dev/null || die "needs nsenter (util-linux)"
    [ "$hosts" -ge 1 ] && [ "$hosts" -le 200 ] || die "1 to 200 hosts, not $hosts"
    [ -e "$dir/tag" ] && die "$dir already holds a cluster; take it down first"
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    local owner=${SYC_OWNER:-$PPID} tag
    if [ -n "${SYC_TAG:-}" ]; then
        # A caller that starts several clusters at once names each (syc<owner>x<n>).
        tag=$SYC_TAG
        case "$tag" in "syc${owner}x"*) ;; *) die "SYC_TAG must start with syc${owner}x" ;; esac
    else
        local n=0
        while ip netns list | grep -qE "^syc${owner}x${n}(h[0-9]+|br)$"; do n=$((n + 1)); done
        tag="syc${owner}x${n}"
    fi
    echo "$tag" >"$dir/tag"
    echo "$owner" >"$dir/owner"
    echo "$dir" >"$dir/dir"
    mkdir -p "$STATE_ROOT/$tag" /run/sshd
    echo "$dir" >"$STATE_ROOT/$tag/dir"
    # From here on a failure takes down what was made.
    trap 'down "$dir" >/dev/null 2>&1 || true' ERR

    local bridge="${tag}br"
    ip netns add "$bridge"
    ip -n "$bridge" link set lo up
    ip -n "$bridge" link add br0 type bridge
    ip -n "$bridge" link set br0 up

    ssh-keygen -q -t ed25519 -N '' -C switchyard-test-cluster -f "$dir/host_key"
    ssh-keygen -q -t ed25519 -N '' -C switchyard-test-cluster -f "$dir/user_key"
    cp "$dir/user_key.pub" "$dir/authorized_keys"
    chmod 600 "$dir/authorized_keys" "$dir/user_key" "$dir/host_key"
    : >"$dir/hostfile"
    cat >"$dir/ssh_config" <<EOF
# Written by scripts/test-cluster.sh for the cluster in $dir.
Host node*
    User root
    IdentityFile $dir/user_key
    IdentitiesOnly yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
EOF
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
        # A name namespace that outlives its processes, bound to a file.
        touch "$(host_uts "$dir" "$i")"
        unshare --uts="$(host_uts "$dir" "$i")" hostname "node$i"
        printf 'Host node%s\n    HostName %s\n' "$i" "$addr" >>"$dir/ssh_config"
        echo "node$i" >>"$dir/hostfile"
        start_sshd "$dir" "$i"
    done
    trap - ERR
    wait_sshd "$dir" "$hosts"
}

start_sshd() {
    local dir=$1 i=$2
    on_host "$dir" "$i" /usr/sbin/sshd -f /dev/null \
        -h "$dir/host_key" \
        -o "ListenAddress=$SUBNET.$((i + 1))" \
        -o "PidFile=$dir/sshd$i.pid" \
        -o "AuthorizedKeysFile=$dir/authorized_keys" \
        -o PermitRootLogin=prohibit-password \
        -o PasswordAuthentication=no \
        -o KbdInteractiveAuthentication=no \
        -o StrictModes=no \
        -o UsePAM=no \
        -o MaxStartups=100 \
        -o MaxSessions=100 \
        -E "$dir/sshd$i.log"
}

# Every host answers a login within 10 s, or `up` fails naming the host.
wait_sshd() {
    local dir=$1 hosts=$2 i tries
    for ((i = 0; i < hosts; i++)); do
        for ((tries = 0; ; tries++)); do
            if on_host "$dir" 0 ssh -F "$dir/ssh_config" -o BatchMode=yes \
                -o ConnectTimeout=2 "node$i" true 2>/dev/null; then
                break
            fi
            if [ "$tries" -ge 50 ]; then
                down "$dir" >/dev/null 2>&1 || true
                die "sshd on node$i did not answer within 10 s (see its log above)"
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
    local ns
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
    local uts
    for uts in "$STATE_ROOT/$tag"/uts*; do
        [ -e "$uts" ] || continue
        umount "$uts" 2>/dev/null || true
    done
    rm -rf "${STATE_ROOT:?}/$tag"
    rm -rf "$dir"
}

# Clusters whose owner process no longer runs.
sweep() {
    local state owner dir
    for state in "$STATE_ROOT"/syc*; do
        [ -d "$state" ] || continue
        owner=${state##*/syc}
        owner=${owner%%x*}
        [ -d "/proc/$owner" ] && continue
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
            for uts in "$state"/uts*; do umount "$uts" 2>/dev/null || true; done
            rm -rf "$state"
        fi
    done
}

case "${1:-}" in
up)
    [ $# -ge 2 ] || die "usage: $0 up DIR [HOSTS]"
    sweep
    up "$2" "${3:-3}"
    ;;
exec)
    [ $# -ge 4 ] || die "usage: $0 exec DIR I CMD..."
    dir=$2 i=$3
    shift 3
    exec nsenter --net="/run/netns/$(host_ns "$dir" "$i")" --uts="$(host_uts "$dir" "$i")" "$@"
    ;;
stop-sshd)
    [ $# -eq 3 ] || die "usage: $0 stop-sshd DIR I"
    kill -TERM "$(cat "$2/sshd$3.pid")"
    ;;
down)
    [ $# -eq 2 ] || die "usage: $0 down DIR"
    down "$2"
    ;;
sweep)
    sweep
    ;;
*)
    die "usage: $0 up DIR [HOSTS] | exec DIR I CMD... | stop-sshd DIR I | down DIR | sweep"
    ;;
esac
