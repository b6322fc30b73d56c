# shellcheck shell=bash
# Shell helpers for the multi-host tests ("tests across hosts"): every stage runs in
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
# link delay), or, where the kernel has no netem, on a userspace emulator between TUN
# devices in the hosts (tun_link, below); "link down" is `ip link set eth0 down` inside the
# host.
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
# and PL_STAGE_CPUS as pl_start_stage (--insecure unless the options or $STRATA_AUTH_KEY give
# one).
nl_start_stage() {
    local tag=$1 S=$2 r=$3 model=$4
    shift 4
    local next=$(((r + 1) % S))
    rm -f "$PL_WORK/$tag.$r.port"
    # shellcheck disable=SC2046
    ip netns exec "$(nl_host_ns "$r")" "$PL_STAGE" --model "$model" --num-stages "$S" \
        --stage-idx "$r" --listen "$(nl_addr "$r"):$NL_PORT" --port-file "$PL_WORK/$tag.$r.port" \
        --next-host "$(nl_addr "$next")" --next-port "$NL_PORT" \
        $(pl_stage_cpus "$r") $(pl_security_default "$@") "$@" >>"$PL_WORK/$tag.$r.out" 2>>"$PL_WORK/$tag.$r.log" &
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

# nl_delay_all MS HOST...: every listed host's link (c: the client's) delayed MS one way, by tc
# netem where the kernel has it, else by the userspace tun_link emulator (a new emulator and new
# devices when one runs already).
nl_delay_all() {
    local ms=$1
    shift
    nl_impair_all "$ms" 0 "$@"
}

# nl_impair_all MS LOSS_PCT HOST...: nl_delay_all, and each packet a host sends lost with
# probability LOSS_PCT % (netem's loss, or tun_link's --loss-pct).
nl_impair_all() {
    local ms=$1 loss=$2 h
    shift 2
    if nl_netem_available; then
        for h in "$@"; do
            if [ "$loss" = 0 ]; then nl_netem "$h" delay "${ms}ms"; else nl_netem "$h" delay "${ms}ms" loss "${loss}%"; fi
        done
        return
    fi
    if [ -n "${NL_TUN_LINK_PID:-}" ]; then
        nl_tun_link_stop
        for h in "$@"; do ip -n "$(nl_host_ns_of "$h")" link del tun0; done
    fi
    nl_tun_link_start "$(awk -v d="$ms" 'BEGIN { printf "%d", d * 1000 }')" 0 "$loss" 1 "$@"
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

# --- tun_link: netem without a qdisc ------------------------------------------------------
# Where the kernel has no netem (CONFIG_NET_SCH_NETEM unset) the impaired links are emulated
# in userspace by tests/pipeline/tun_link.c: every impaired host gets a TUN device tun0 and a
# /32 route through it, with its own address as the source, for every other impaired host's
# address. Those routes beat the /24 on eth0, so host-to-host IP traffic leaves through tun0,
# where tun_link reads it, holds it 2 ms +- 0.5 ms (or drops it) and writes it, unmodified,
# into the destination host's tun0, whose kernel takes it as arriving from the wire (the
# destination address is its own; the reverse route also points at tun0, so rp_filter
# agrees). One packet crosses one emulated link: a hop is one delay, as with one netem per
# host egress. The bridge still carries ARP and anything addressed elsewhere.

# nl_host_ns_of R|c: the namespace of stage host R, or of the client ("c").
nl_host_ns_of() {
    if [ "$1" = c ]; then echo "$NL_CLIENT"; else nl_host_ns "$1"; fi
}
nl_host_addr_of() {
    if [ "$1" = c ]; then echo "$NL_CLIENT_ADDR"; else nl_addr "$1"; fi
}

# nl_tun_available: /dev/net/tun exists and a tun device can be made in a namespace; the
# reason is left in $PL_WORK/tun.err otherwise.
nl_tun_available() {
    [ -c /dev/net/tun ] || {
        echo "no /dev/net/tun" >"$PL_WORK/tun.err"
        return 1
    }
    ip -n "$NL_SWITCH" tuntap add dev tprobe0 mode tun 2>"$PL_WORK/tun.err" || return 1
    ip -n "$NL_SWITCH" tuntap del dev tprobe0 mode tun
}

# nl_tun_link_start DELAY_US JITTER_US LOSS_PCT SEED HOST...: tun0 and the routes above on
# each HOST (R or c), then tun_link between them; returns once every tun is attached. Its
# stdout (the counters, at exit) goes to $PL_WORK/tun_link.out.
nl_tun_link_start() {
    local delay=$1 jitter=$2 loss=$3 seed=$4 h o ns args=()
    shift 4
    NL_TUN_LINK="$(dirname "$PL_BIN")/tests/pipeline/tun_link" # runfiles or bazel-bin
    [ -x "$NL_TUN_LINK" ] || pl_fail "tun_link not found at $NL_TUN_LINK (build //tests/pipeline:tun_link)"
    for h in "$@"; do
        ns=$(nl_host_ns_of "$h")
        ip -n "$ns" tuntap add dev tun0 mode tun || pl_fail "cannot make tun0 on host $h"
        ip -n "$ns" link set tun0 up || pl_fail "cannot bring tun0 up on host $h"
        for o in "$@"; do
            [ "$o" = "$h" ] && continue
            ip -n "$ns" route add "$(nl_host_addr_of "$o")/32" dev tun0 \
                src "$(nl_host_addr_of "$h")" || pl_fail "cannot route host $h to $o via tun0"
        done
        args+=(--host "$ns=$(nl_host_addr_of "$h")")
    done
    rm -f "$PL_WORK/tun_link.ready"
    "$NL_TUN_LINK" "${args[@]}" --delay-us "$delay" --jitter-us "$jitter" --loss-pct "$loss" \
        --seed "$seed" --ready-file "$PL_WORK/tun_link.ready" >"$PL_WORK/tun_link.out" \
        2>"$PL_WORK/tun_link.log" &
    NL_TUN_LINK_PID=$!
    PL_PIDS="$PL_PIDS $NL_TUN_LINK_PID"
    pl_wait_file "$PL_WORK/tun_link.ready" 5 ||
        pl_fail "tun_link did not attach its devices: $(cat "$PL_WORK/tun_link.log")"
}

# nl_tun_link_stop: SIGTERM to tun_link, which prints its counters and exits 0.
nl_tun_link_stop() {
    kill -TERM "$NL_TUN_LINK_PID" 2>/dev/null
    wait "$NL_TUN_LINK_PID" || pl_fail "tun_link exited $?: $(cat "$PL_WORK/tun_link.log")"
}

# nl_tun_link_stat KEY: a counter from the stopped tun_link's output.
nl_tun_link_stat() {
    sed -n "s/^$1 //p" "$PL_WORK/tun_link.out"
}

# nl_rtt_ms NS ADDR N: the median of N round trips, in ms, from NS to ADDR: each a bash
# /dev/tcp connect to the closed port 9 (SYN out, RST back), timed in the shell itself so no
# process start is counted. The median ignores the rare round trip whose SYN was lost.
nl_rtt_ms() {
    # shellcheck disable=SC2016 # the inner script's own variables
    ip netns exec "$1" bash -c '
        for ((i = 0; i < $2; i++)); do
            s=${EPOCHREALTIME/./}
            : 2>/dev/null 3<>"/dev/tcp/$1/9"
            e=${EPOCHREALTIME/./}
            echo $((e - s))
        done' rtt "$2" "$3" | sort -n | awk '{ v[NR] = $1 } END { printf "%.3f", v[int((NR + 1) / 2)] / 1000 }'
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
