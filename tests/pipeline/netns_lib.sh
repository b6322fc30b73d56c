# shellcheck shell=bash
# Shell helpers for the multi-host tests (issue 15, "tests across hosts"): every stage runs in
# its own Linux network namespace, a "host" with one interface, and the hosts meet on a
# bridge in a "switch" namespace, as machines on one Ethernet segment would:
#
#     client ns 10.77.0.100 --+
#     host 0 ns 10.77.0.10 ---+--- br0 in the switch ns
#     ...                     |
#     host R ns 10.77.0.(10+R)+
#
# Each host's link is a veth pair made directly inside the namespaces (eth0 in the host, pR
# on the bridge), so nothing is ever added to the caller's own network namespace: the
# 10.77.0.0/24 addresses exist only inside these namespaces and cannot clash with the
# machine's network or with another run of these tests (each run has its own namespaces).
# Impairments go on the host's end of its link (one netem per packet: a hop is exactly one
# link delay), and "link down" is `ip link set eth0 down` inside the host.
#
# Built on pipeline_lib.sh: the same work directory, log names ($PL_WORK/TAG.R.log), pids
# (PL_PIDS, pl_pid) and waits (pl_wait_ready, pl_stop_pipeline), so only the start of a
# stage and of the client differ. Needs root and `ip netns`; where either is missing (not
# root, no iproute2, a sandbox whose /run/netns is read-only) nl_init prints "skipped: ..."
# and exits 0. The namespaces are deleted on every exit, failure included.
. "$(dirname "${BASH_SOURCE[0]}")/pipeline_lib.sh"

NL_PORT=7000
NL_NETNS=""

nl_skip() {
    echo "skipped: $*"
    exit 0
}

# nl_cleanup: kills every started process (pl_cleanup), then deletes the namespaces (their
# veths and the bridge go with them).
nl_cleanup() {
    local ns
    pl_cleanup
    for ns in $NL_NETNS; do
        ip netns del "$ns" 2>/dev/null
        [ -d "/etc/netns/$ns" ] && rm -rf "/etc/netns/${ns:?}"
    done
    NL_NETNS=""
}

# nl_hosts_file NS LINE...: the /etc/hosts that processes started in NS see (`ip netns exec`
# bind-mounts /etc/netns/NS/hosts over /etc/hosts): localhost plus the given lines, so host
# names resolve as a cluster's DNS would. Removed with the namespace.
nl_hosts_file() {
    local ns=$1
    shift
    mkdir -p "/etc/netns/$ns" || pl_fail "cannot create /etc/netns/$ns"
    { echo "127.0.0.1 localhost"; printf '%s\n' "$@"; } >"/etc/netns/$ns/hosts"
}

nl_addr() { echo "10.77.0.$((10 + $1))"; }
NL_CLIENT_ADDR=10.77.0.100
nl_host_ns() { echo "$NL_PREFIX-h$1"; }

nl_add_ns() {
    ip netns add "$1" 2>"$PL_WORK/netns.err" || return 1
    NL_NETNS="$NL_NETNS $1"
    ip -n "$1" link set lo up
}

# nl_add_host NS ADDR PORT_NAME: a host namespace whose eth0 (ADDR/24) is cabled to the
# bridge port PORT_NAME in the switch namespace.
nl_add_host() {
    local ns=$1 addr=$2 port=$3
    nl_add_ns "$ns" || pl_fail "ip netns add $ns: $(cat "$PL_WORK/netns.err")"
    ip -n "$NL_SWITCH" link add "$port" type veth peer name eth0 netns "$ns" ||
        pl_fail "cannot make the veth pair for $ns"
    ip -n "$NL_SWITCH" link set "$port" master br0 up || pl_fail "cannot attach $port to br0"
    ip -n "$ns" addr add "$addr/24" dev eth0 || pl_fail "cannot give $ns the address $addr"
    ip -n "$ns" link set eth0 up || pl_fail "cannot bring $ns's eth0 up"
}

# nl_init HOSTS: pl_init, the skip checks, then the switch, HOSTS stage hosts and a client
# host. Returns once the client host reaches every stage host.
nl_init() {
    local hosts=$1 i
    pl_init
    trap nl_cleanup EXIT
    trap 'nl_cleanup; exit 1' INT TERM
    [ "$(id -u)" = 0 ] || nl_skip "needs root for network namespaces (uid $(id -u))"
    command -v ip >/dev/null 2>&1 || nl_skip "no ip command (Debian package iproute2)"
    # A name no other run has: the namespaces are global to the machine.
    for i in 1 2 3 4 5; do
        NL_PREFIX="strata$RANDOM$RANDOM"
        ls /run/netns/"$NL_PREFIX"-* >/dev/null 2>&1 || break
    done
    NL_SWITCH="$NL_PREFIX-sw"
    nl_add_ns "$NL_SWITCH" ||
        nl_skip "cannot create network namespaces: $(head -c 200 "$PL_WORK/netns.err")"
    ip -n "$NL_SWITCH" link add br0 type bridge 2>"$PL_WORK/netns.err" ||
        nl_skip "no bridge support in this kernel: $(head -c 200 "$PL_WORK/netns.err")"
    ip -n "$NL_SWITCH" link add probe0 type veth peer name probe1 2>"$PL_WORK/netns.err" ||
        nl_skip "no veth support in this kernel: $(head -c 200 "$PL_WORK/netns.err")"
    ip -n "$NL_SWITCH" link del probe0
    ip -n "$NL_SWITCH" link set br0 up
    for ((i = 0; i < hosts; i++)); do
        nl_add_host "$(nl_host_ns "$i")" "$(nl_addr "$i")" "p$i"
    done
    NL_CLIENT="$NL_PREFIX-c"
    nl_add_host "$NL_CLIENT" "$NL_CLIENT_ADDR" pc
    for ((i = 0; i < hosts; i++)); do
        nl_ping "$NL_CLIENT" "$(nl_addr "$i")" ||
            pl_fail "host $i ($(nl_addr "$i")) does not answer from the client host"
    done
    echo "hosts: switch $NL_SWITCH, stage hosts $(for ((i = 0; i < hosts; i++)); do printf '%s ' "$(nl_addr "$i")"; done)client $NL_CLIENT_ADDR"
}

# nl_ping NS ADDR: ADDR answers from NS within 5 s. Not ping (not always installed): a bash
# /dev/tcp connect to a closed port, where "connection refused" proves the host answered and
# a timeout or "no route" that it did not.
nl_ping() {
    local ns=$1 addr=$2 i
    for ((i = 0; i < 50; i++)); do
        if ip netns exec "$ns" timeout 1 bash -c "exec 3<>/dev/tcp/$addr/9" 2>&1 |
            grep -q "Connection refused"; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

# nl_start_stage TAG S R MODEL [strata-stage options...]: stage R of TAG on host R, listening
# on its host's address and connecting to host R+1's (the last stage to host 0's). Security
# as pl_start_stage (--insecure unless the options or $STRATA_AUTH_KEY give one).
nl_start_stage() {
    local tag=$1 S=$2 r=$3 model=$4
    shift 4
    local next=$(((r + 1) % S))
    rm -f "$PL_WORK/$tag.$r.port"
    # shellcheck disable=SC2046
    ip netns exec "$(nl_host_ns "$r")" "$PL_STAGE" --model "$model" --num-stages "$S" \
        --stage-idx "$r" --listen "$(nl_addr "$r"):$NL_PORT" --port-file "$PL_WORK/$tag.$r.port" \
        --next-host "$(nl_addr "$next")" --next-port "$NL_PORT" \
        $(pl_security_default "$@") "$@" >>"$PL_WORK/$tag.$r.out" 2>>"$PL_WORK/$tag.$r.log" &
    local pid=$!
    PL_PIDS="$PL_PIDS $pid"
    eval "PL_PID_${tag}_$r=$pid"
}

# nl_start_pipeline TAG S MODEL [options...]: S stages on hosts 0..S-1, ready when every hop
# is connected; then checks that each stage's links really run between the host addresses.
nl_start_pipeline() {
    local tag=$1 S=$2 model=$3 r
    shift 3
    for ((r = 0; r < S; r++)); do
        nl_start_stage "$tag" "$S" "$r" "$model" "$@"
    done
    pl_wait_ready "$tag" "$S"
    for ((r = 0; r < S; r++)); do
        grep -q "listening on $(nl_addr "$r"):$NL_PORT" "$PL_WORK/$tag.$r.log" ||
            pl_fail "stage $r of $tag does not listen on its host address $(nl_addr "$r")"
        [ "$S" -gt 1 ] || continue
        nl_established "$r" "$(nl_addr $(((r + 1) % S))):$NL_PORT" ||
            pl_fail "stage $r of $tag has no TCP connection from $(nl_addr "$r") to its next host"
    done
}

# nl_established R PEER_ADDR:PORT: host R has an established TCP connection to it.
nl_established() {
    ip netns exec "$(nl_host_ns "$1")" ss -Htn state established dst "$2" 2>/dev/null |
        grep -q .
}

# nl_client [strata-client options...]: strata-client on the client host, to stage 0 on host 0.
nl_client() {
    # shellcheck disable=SC2046
    ip netns exec "$NL_CLIENT" "$PL_CLIENT" --host "$(nl_addr 0)" --port "$NL_PORT" \
        --timeout-ms 20000 $(pl_security_default "$@") "$@"
}

# nl_netem_available: the kernel has the netem qdisc (probed on a throwaway veth).
nl_netem_available() {
    command -v tc >/dev/null 2>&1 || return 1
    ip -n "$NL_SWITCH" link add nprobe0 type veth peer name nprobe1 || return 1
    ip netns exec "$NL_SWITCH" tc qdisc add dev nprobe0 root netem delay 1ms 2>"$PL_WORK/netem.err"
    local rc=$?
    ip -n "$NL_SWITCH" link del nprobe0
    return $rc
}

# nl_netem R ARGS...: netem ARGS on the egress of host R's link ("c" = the client's host).
nl_netem() {
    local ns
    if [ "$1" = c ]; then ns=$NL_CLIENT; else ns=$(nl_host_ns "$1"); fi
    shift
    ip netns exec "$ns" tc qdisc replace dev eth0 root netem "$@" ||
        pl_fail "tc qdisc netem $* on $ns failed"
}

# nl_nft_loss R PERCENT: drops PERCENT % of the frames host R sends, chosen at random by
# nftables on the bridge (for kernels without netem; no delay). The drop happens in the
# switch, after the frame left the host, so TCP sees a real loss on the wire (a drop in the
# host's own output hook would be reported back to TCP as a local error and retried at once).
nl_nft_loss() {
    local port=p$1
    if ! ip netns exec "$NL_SWITCH" nft list table bridge strata_loss >/dev/null 2>&1; then
        if ! ip netns exec "$NL_SWITCH" nft add table bridge strata_loss ||
            ! ip netns exec "$NL_SWITCH" nft add chain bridge strata_loss impair \
                "{ type filter hook forward priority 0; policy accept; }"; then
            pl_fail "nftables table on the switch failed"
        fi
    fi
    ip netns exec "$NL_SWITCH" nft add rule bridge strata_loss impair iifname "$port" \
        numgen random mod 100 "<" "$2" counter drop || pl_fail "nftables loss rule for $port failed"
}

# nl_nft_dropped R: frames from host R the loss rule has dropped.
nl_nft_dropped() {
    ip netns exec "$NL_SWITCH" nft list chain bridge strata_loss impair |
        sed -n "s/.*iifname \"p$1\" .*counter packets \([0-9]*\) .*/\1/p"
}

# nl_link R up|down: host R's link (its eth0) administratively up or down.
nl_link() {
    ip -n "$(nl_host_ns "$1")" link set eth0 "$2" || pl_fail "ip link set eth0 $2 on host $1 failed"
}

# nl_tx_packets R: packets host R has sent on its link.
nl_tx_packets() {
    ip netns exec "$(nl_host_ns "$1")" cat /sys/class/net/eth0/statistics/tx_packets
}
