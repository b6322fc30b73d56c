#!/usr/bin/env bash
# Integration, tests across hosts: the 4-host pipeline of netns_pipeline_test.sh
# with every link impaired by 2 ms +- 0.5 ms delay (uniform jitter) and 1% loss still gives
# the golden tokens for 8 concurrent copies of a golden prompt, 4 rounds, and the last
# stage's --out (tokens + logits) is byte-identical to the unimpaired 4-host run's and to one
# stage's on loopback. Prints which mechanism impaired the links, the measured round trip
# client -> host 1 before and after (2 hops: about 4 ms more), and tokens/s both ways.
#
# Mechanism: tc netem on each host's egress (the client's too) where the kernel has the
# netem qdisc; otherwise tun_link (tests/pipeline/tun_link.c, netns_lib.sh), a userspace
# emulator between TUN devices in the 5 hosts, whose counters must show the emulation
# happened: packets forwarded, some dropped, none lost to its queue bound, every applied
# delay >= 1.5 ms and the mean within 2 ms +- 0.5 ms (+ 1 ms of scheduling slack on this
# shared machine). Either way every packet crosses exactly one impaired link per hop.
# Skipped, with the reason, without root, network namespaces, or (no netem) /dev/net/tun.
set -u
. "$(dirname "$0")/netns_lib.sh"
nl_init 4

case=qwen3_deep8
model=$(pl_golden "$case")
prompt=$(pl_golden_prompt "$case")
want=$(pl_golden_generated "$case")
steps=$(pl_golden_steps "$case")
opts=(--max-seq 256 --max-batch 8 --chunk-size 8)
hosts="0 1 2 3 c"

# A key of this run only: every link runs TLS 1.3 (PSK), as it would between machines.
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PL_WORK/key"
export STRATA_AUTH_KEY="$(cat "$PL_WORK/key")"

# rounds TAG CLIENT...: 4 rounds of 8 concurrent golden requests through the command CLIENT
# (enough packets for 1% loss to hit some); prints each round's tokens/s.
rounds() {
    local tag=$1 i round
    shift
    for round in 1 2 3 4; do
        "$@" --prompt "$prompt" --copies 8 --max-tokens "$steps" >"$PL_WORK/$tag.client" ||
            pl_fail "$tag: client failed: $(cat "$PL_WORK/$tag.client")"
        for ((i = 0; i < 8; i++)); do
            got=$(pl_tokens_of "$PL_WORK/$tag.client" "$i")
            [ "$got" = "$want" ] || pl_fail "$tag: round $round request $i tokens $got, golden $want"
        done
        echo "$tag round $round: 8 requests x $steps tokens, every one golden;" \
            "$(grep '^total:' "$PL_WORK/$tag.client" | sed 's/^total: //')"
    done
    pl_wait_file "$PL_WORK/$tag.safetensors" 5 || pl_fail "$tag: no --out file"
}

# run TAG: the 4-host pipeline, the rounds from the client host.
run() {
    nl_start_pipeline "$1" 4 "$model" "${opts[@]}" --out "$PL_WORK/$1.safetensors"
    rounds "$1" nl_client
    pl_stop_pipeline "$1" 4
}

# The reference: one stage on this machine's loopback, the same requests.
pl_start_pipeline one 1 "$model" "${opts[@]}" --out "$PL_WORK/one.safetensors"
rounds one pl_client one
pl_stop_pipeline one 1

run clean
cmp -s "$PL_WORK/clean.safetensors" "$PL_WORK/one.safetensors" ||
    pl_fail "tokens/logits on 4 clean hosts differ from one stage"
rtt_clean=$(nl_rtt_ms "$NL_CLIENT" "$(nl_addr 1)" 21)

if nl_netem_available; then
    mode=netem
    for h in $hosts; do nl_netem "$h" delay 2ms 0.5ms loss 1%; done
    echo "mechanism: tc netem on every host's eth0 egress:" \
        "$(ip netns exec "$(nl_host_ns 1)" tc qdisc show dev eth0)"
elif nl_tun_available; then
    mode=tun_link
    seed=${STRATA_TUN_LINK_SEED:-$((RANDOM * 32768 + RANDOM))}
    echo "mechanism: tun_link (no netem qdisc in this kernel: $(head -c 200 "$PL_WORK/netem.err"));" \
        "userspace delay 2 ms +- 0.5 ms and 1% loss between tun0 devices on hosts $hosts," \
        "seed $seed (STRATA_TUN_LINK_SEED sets it)"
    # shellcheck disable=SC2086
    nl_tun_link_start 2000 500 1 "$seed" $hosts
else
    nl_skip "the kernel has no netem qdisc ($(head -c 200 "$PL_WORK/netem.err")) and no tun" \
        "device can be made for tun_link ($(head -c 200 "$PL_WORK/tun.err"))"
fi

# The delay is real: the round trip from the client to host 1 crosses 2 impaired links, each
# at least 1.5 ms.
rtt=$(nl_rtt_ms "$NL_CLIENT" "$(nl_addr 1)" 21)
echo "round trip client -> host 1 (median of 21 TCP connects): $rtt_clean ms clean," \
    "$rtt ms impaired ($mode): +$(awk -v a="$rtt" -v b="$rtt_clean" 'BEGIN { printf "%.3f", a - b }')" \
    "ms for 2 hops of 2 ms +- 0.5 ms"
awk -v a="$rtt" 'BEGIN { exit !(a >= 3.0) }' ||
    pl_fail "round trip $rtt ms over 2 impaired hops, expected >= 3 ms: the delay is not applied"

run impaired
cmp -s "$PL_WORK/impaired.safetensors" "$PL_WORK/clean.safetensors" ||
    pl_fail "tokens/logits over the impaired links differ from the clean run"
echo "impaired: --out byte-identical to the clean 4-host run and to one stage"

if [ "$mode" = netem ]; then
    for h in $hosts; do
        echo "host $h: $(ip netns exec "$(nl_host_ns_of "$h")" tc -s qdisc show dev eth0 |
            grep -o 'Sent .*dropped [0-9]*')"
    done
else
    nl_tun_link_stop
    fwd=$(nl_tun_link_stat forwarded)
    drop=$(nl_tun_link_stat dropped)
    over=$(nl_tun_link_stat overflow)
    unr=$(nl_tun_link_stat unroutable)
    dmin=$(nl_tun_link_stat delay_min_ms)
    dmean=$(nl_tun_link_stat delay_mean_ms)
    dmax=$(nl_tun_link_stat delay_max_ms)
    echo "tun_link: forwarded $fwd packets ($(nl_tun_link_stat forwarded_bytes) bytes)," \
        "dropped $drop ($(awk -v d="$drop" -v f="$fwd" 'BEGIN { printf "%.2f", 100 * d / (d + f) }')%)," \
        "overflow $over, unroutable $unr, not IPv4 $(nl_tun_link_stat not_ipv4) (the kernel's IPv6" \
        "chatter on tun0, dropped);" \
        "applied delay min $dmin / mean $dmean / max $dmax ms"
    [ "${fwd:-0}" -gt 1000 ] || pl_fail "tun_link forwarded only ${fwd:-no} packets"
    [ "${drop:-0}" -gt 0 ] || pl_fail "tun_link dropped no packet at 1% loss"
    [ "$over" = 0 ] || pl_fail "tun_link's queue overflowed ($over packets)"
    [ "$unr" = 0 ] || pl_fail "tun_link got $unr packets for addresses of no host"
    awk -v a="$dmin" -v m="$dmean" 'BEGIN { exit !(a >= 1.5 && m >= 1.5 && m <= 3.5) }' ||
        pl_fail "tun_link delays min $dmin / mean $dmean ms, want min >= 1.5 and mean in [1.5, 3.5]"
fi
echo "PASS ($mode)"
