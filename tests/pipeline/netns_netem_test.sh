#!/usr/bin/env bash
# Integration, issue 15 "tests across hosts": the 4-host pipeline of netns_pipeline_test.sh
# with every link impaired by tc netem, 2 ms +- 0.5 ms delay and 1% loss on each host's
# egress (the client's too; every packet crosses one netem, so a hop is 2 ms +- 0.5 ms and
# 1% loss), still gives the golden tokens for 8 concurrent copies of a golden prompt, and
# the last stage's --out (tokens + logits) is byte-identical to the unimpaired run's.
# Prints tokens/s without and with the impairment.
# Where the kernel has no netem qdisc (CONFIG_NET_SCH_NETEM unset) the same run is made with
# 1% random loss only (nftables numgen, no delay) and the test reports itself skipped, with
# that reason, since the delay and jitter were not tested. Skipped outright without root or
# network namespaces.
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

# run TAG: the 4-host pipeline, 4 rounds of 8 concurrent golden requests (enough packets for
# 1% loss to hit some); prints each round's tokens/s.
run() {
    local tag=$1 i round
    nl_start_pipeline "$tag" 4 "$model" "${opts[@]}" --out "$PL_WORK/$tag.safetensors"
    for round in 1 2 3 4; do
        nl_client --prompt "$prompt" --copies 8 --max-tokens "$steps" >"$PL_WORK/$tag.client" ||
            pl_fail "$tag: client failed: $(cat "$PL_WORK/$tag.client")"
        for ((i = 0; i < 8; i++)); do
            got=$(pl_tokens_of "$PL_WORK/$tag.client" "$i")
            [ "$got" = "$want" ] || pl_fail "$tag: round $round request $i tokens $got, golden $want"
        done
        echo "$tag round $round: 8 requests x $steps tokens, every one golden;" \
            "$(grep '^total:' "$PL_WORK/$tag.client" | sed 's/^total: //')"
    done
    pl_wait_file "$PL_WORK/$tag.safetensors" 5 || pl_fail "$tag: no --out file"
    pl_stop_pipeline "$tag" 4
}

run clean
if nl_netem_available; then
    mode=netem
    for h in $hosts; do nl_netem "$h" delay 2ms 0.5ms loss 1%; done
    ip netns exec "$(nl_host_ns 1)" tc qdisc show dev eth0
elif command -v nft >/dev/null 2>&1; then
    mode=nft
    echo "no netem qdisc in this kernel ($(cat "$PL_WORK/netem.err" 2>/dev/null)):" \
        "1% random loss with nftables instead, no delay"
    for h in $hosts; do nl_nft_loss "$h" 1; done
else
    nl_skip "the kernel has no netem qdisc ($(cat "$PL_WORK/netem.err" 2>/dev/null)) and nft is not installed"
fi
for h in 0 1 2 3; do eval "tx_before_$h=$(nl_tx_packets "$h")"; done
run impaired
cmp -s "$PL_WORK/impaired.safetensors" "$PL_WORK/clean.safetensors" ||
    pl_fail "tokens/logits over the impaired links differ from the clean run"
echo "impaired: --out byte-identical to the clean run"
if [ "$mode" = netem ]; then
    for h in $hosts; do
        ns=$NL_CLIENT
        [ "$h" = c ] || ns=$(nl_host_ns "$h")
        echo "host $h: $(ip netns exec "$ns" tc -s qdisc show dev eth0 | grep -o 'Sent .*dropped [0-9]*')"
    done
    echo "PASS"
else
    dropped=0 sent=0
    for h in $hosts; do dropped=$((dropped + $(nl_nft_dropped "$h"))); done
    for h in 0 1 2 3; do sent=$((sent + $(nl_tx_packets "$h") - $(eval "echo \$tx_before_$h"))); done
    echo "nftables dropped $dropped packets on the 5 links (the 4 stage hosts sent $sent meanwhile)"
    echo "skipped: kernel has no netem qdisc (CONFIG_NET_SCH_NETEM): 2 ms +- 0.5 ms delay not" \
        "tested; the golden tokens held under 1% random loss (nftables, $dropped packets dropped)"
fi
