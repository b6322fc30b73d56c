#!/usr/bin/env bash
# `./strata bench tp`: decode tokens/s of the Qwen3-0.6B-shaped random bf16
# checkpoint at tensor-parallel degree 1 and 2, one thread per rank, every rank a real
# strata-stage process, with the all-reduce count and time per decoded token. A benchmark,
# not a test: nothing is asserted beyond the runs succeeding.
#
# Configurations (started side by side, measured interleaved round by round, medians of
# BENCH_REPEAT rounds, since the host may be shared):
#   tp1         one strata-stage, --threads 1
#   tp2_shm     two ranks on loopback, --threads 1 each, group data on shared memory
#   tp2_tcp     the same over the group's TCP ring on loopback (--tp-tcp)
#   tp2_hosts   the two ranks on two hosts: Linux network namespaces joined by veth pairs on
#               a bridge (tests/pipeline/netns_lib.sh), TCP ring between 10.77.0.10 and
#               10.77.0.11, the client on a third host; skipped, with the reason, when not
#               root or namespaces cannot be made
# Each round sends, per configuration, a short request (BENCH_SHORT tokens) and a long one
# (BENCH_SHORT + BENCH_TOKENS) with the same prompt: decode tokens/s is the long request's
# (strata-client: (n - 1) / (last token - first token)); the collectives per decoded token
# are the difference of the two requests' counts (the leader logs its group's counters after
# every request: "group collectives: ..." from wire/collective.h coll_stats) divided by the
# BENCH_TOKENS extra tokens, so the prompt's prefill cancels. The all-reduce time is the
# leader's wall time inside coll_allreduce_sum: the transfer plus waiting for the other rank
# to arrive (their load imbalance), i.e. what TP adds to a token beyond the split compute.
# Each rank's CPU time per decoded token (/proc/PID/stat, the same difference of the two
# requests) is printed beside the wall clock: on a host shared with other work (this one has
# 2 cores and often a load of 10+) the wall-clock ratio says more about the scheduler than
# about TP, while TP 1's CPU time over the busier TP 2 rank's shows how evenly the compute
# was split and what the collectives cost in CPU.
#
# The checkpoint is strata-bench-decode's (hidden 1024, 28 layers, 16 q / 8 kv heads, head_dim
# 128, intermediate 3072, vocab 151936, tied), written once to $PEERS_DIR (default
# ~/.cache/strata/peers-model; `./strata bench peers` uses the same directory).
# Anchor: distributed-llama reports 1.46x at 2 nodes (7B); the issue's goal is >= 1.7x at TP 2.
# Env: BENCH_REPEAT (3), BENCH_TOKENS (32), BENCH_SHORT (4), BENCH_PROMPT (8 prompt ids),
# PEERS_DIR, BENCH_NETNS (1; 0 skips the two-host configuration), STRATA_BAZEL_FLAGS.
#
# --moe: the MoE question instead (expert parallel or each expert split): strata-bench-backend's
# qwen3-moe-small checkpoint (Qwen3-MoE routing, 64 experts top-8, moe_intermediate 384, on
# hidden 1024, 16 layers, 16 q / 8 kv heads, vocab 151936, tied; ~2.9 GB in $MOE_DIR, default
# ~/.cache/strata/qwen3-moe-small) at tp1, tp2_expert (--moe expert) and tp2_split (--moe split),
# both TP 2 ones on shared memory, printing per decoded token the wall ms, each rank's CPU ms
# (under expert parallel a rank computes only the experts its tokens routed to, so the ranks'
# CPU times differ) and every collective's calls, KB and ms.
set -u
usage() {
    sed -n '2,/^set -u$/p' "$0" | sed '$d; s/^# \{0,1\}//'
}
case "${1:-}" in
-h | --help)
    echo "usage: ./strata bench tp [--moe]   (tools/bench_tp.sh; other options via the environment)"
    usage
    exit 0
    ;;
"") ;;
--moe) moe=1 ;;
*)
    echo "bench tp: unexpected argument '$1' (see --help)" >&2
    exit 2
    ;;
esac
moe=${moe:-0}
cd "$(dirname "$0")/.."
targets=(//runtime:strata-stage //runtime:strata-client //reference/tools:strata-bench-decode)
[ "$moe" = 1 ] && targets=(//runtime:strata-stage //runtime:strata-client //runtime:strata-bench-backend)
. tools/bench_build.sh
bench_build "${targets[@]}"
. tests/pipeline/netns_lib.sh
# Two hosts need root and network namespaces: probe first (nl_init's own skip would end the
# whole benchmark), then nl_init makes the work directory and the hosts, or pl_init only.
hosts_note=""
if [ "$moe" = 1 ]; then
    hosts_note="--moe compares the MoE modes on one host"
elif [ "${BENCH_NETNS:-1}" != 1 ]; then
    hosts_note="BENCH_NETNS=0"
elif [ "$(id -u)" != 0 ]; then
    hosts_note="needs root for network namespaces (uid $(id -u))"
elif ! command -v ip >/dev/null 2>&1; then
    hosts_note="no ip command (Debian package iproute2)"
elif ! err=$(ip netns add "strata-probe$$" 2>&1); then
    hosts_note="cannot create network namespaces: ${err:0:200}"
else
    ip netns del "strata-probe$$"
fi
if [ -z "$hosts_note" ]; then
    nl_init 2 >/dev/null
else
    pl_init
fi
repeat=${BENCH_REPEAT:-3}
N=${BENCH_TOKENS:-32}
short=${BENCH_SHORT:-4}
plen=${BENCH_PROMPT:-8}
model=${PEERS_DIR:-$HOME/.cache/strata/peers-model}
. tools/bench_model.sh
if [ "$moe" = 1 ]; then
    model=${MOE_DIR:-$HOME/.cache/strata/qwen3-moe-small}
    bench_moe_model "$model" "$STRATA_BIN_DIR" || pl_fail "cannot write the MoE checkpoint to $model"
else
    bench_model "$model" "$STRATA_BIN_DIR" || pl_fail "cannot write the benchmark checkpoint to $model"
fi
prompt=$(awk -v n="$plen" 'BEGIN { for (i = 0; i < n; i++) printf "%s%d", i ? "," : "", (i * 7919 + 13) % 151936 }')
opts=(--threads 1 --max-seq 256 --max-batch 1 --insecure)

# tp_rank_start TAG T R PEERS [options...]: TP rank R >= 1 of TAG's only stage (a follower).
tp_rank_start() {
    local tag=$1 T=$2 r=$3 peers=$4
    shift 4
    "$PL_STAGE" --model "$model" --tp "$T" --tp-rank "$r" --tp-peers "$peers" "$@" \
        >>"$PL_WORK/$tag.0.tp$r.out" 2>>"$PL_WORK/$tag.0.tp$r.log" &
    PL_PIDS="$PL_PIDS $!"
    ranks[$tag]="${ranks[$tag]} $!"
}

configs="tp1 tp2_shm tp2_tcp"
[ "$moe" = 1 ] && configs="tp1 tp2_expert tp2_split"
declare -A ranks # the pids of each configuration's ranks, leader first
pl_start_stage tp1 1 0 "$model" "${opts[@]}"
ranks[tp1]=$(pl_pid tp1 0)
for tag in ${configs#tp1 }; do
    extra=()
    [ "$tag" = tp2_tcp ] && extra=(--tp-tcp)
    [ "$tag" = tp2_expert ] && extra=(--moe expert)
    [ "$tag" = tp2_split ] && extra=(--moe split)
    peers="127.0.0.1:@$PL_WORK/$tag.g0.port,127.0.0.1:@$PL_WORK/$tag.g1.port"
    pl_start_stage "$tag" 1 0 "$model" "${opts[@]}" "${extra[@]}" --tp 2 --tp-rank 0 --tp-peers "$peers"
    ranks[$tag]=$(pl_pid "$tag" 0)
    tp_rank_start "$tag" 2 1 "$peers" "${opts[@]}" "${extra[@]}"
done
for tag in $configs; do
    pl_wait_log "$PL_WORK/$tag.0.log" "listening on" 1 300 || pl_fail "$tag did not start"
done
for tag in $configs; do
    case $tag in
    tp2_tcp) grep -q "connected over tcp" "$PL_WORK/$tag.0.log" || pl_fail "$tag is not on TCP" ;;
    tp2_*) grep -q "connected over shared memory" "$PL_WORK/$tag.0.log" || pl_fail "$tag is not on shared memory" ;;
    esac
done

# The two-host configuration: one rank per host (TCP: the namespaces share this machine's
# /dev/shm, so --tp-tcp keeps the group's data on the veth links).
if [ -z "$hosts_note" ]; then
    peers="$(nl_addr 0):7100,$(nl_addr 1):7100"
    ip netns exec "$(nl_host_ns 0)" "$PL_STAGE" --model "$model" --listen "$(nl_addr 0):$NL_PORT" \
        "${opts[@]}" --tp 2 --tp-rank 0 --tp-peers "$peers" --tp-tcp \
        >>"$PL_WORK/tp2_hosts.0.out" 2>>"$PL_WORK/tp2_hosts.0.log" &
    PL_PIDS="$PL_PIDS $!"
    ranks[tp2_hosts]=$! # `ip netns exec` execs the command: this is strata-stage's pid
    ip netns exec "$(nl_host_ns 1)" "$PL_STAGE" --model "$model" "${opts[@]}" --tp 2 --tp-rank 1 \
        --tp-peers "$peers" --tp-tcp >>"$PL_WORK/tp2_hosts.0.tp1.out" 2>>"$PL_WORK/tp2_hosts.0.tp1.log" &
    PL_PIDS="$PL_PIDS $!"
    ranks[tp2_hosts]="${ranks[tp2_hosts]} $!"
    pl_wait_log "$PL_WORK/tp2_hosts.0.log" "listening on" 1 300 || pl_fail "tp2_hosts did not start"
    nl_established 0 "$(nl_addr 1):7100" || nl_established 1 "$(nl_addr 0):7100" ||
        pl_fail "tp2_hosts: no TCP connection between the two hosts' addresses"
    configs="$configs tp2_hosts"
fi

# client TAG MAX_TOKENS OUT: one request (on the client host for tp2_hosts).
client() {
    if [ "$1" = tp2_hosts ]; then
        nl_client --insecure --prompt "$prompt" --max-tokens "$2" --quiet >"$3" 2>&1
    else
        pl_client "$1" --insecure --prompt "$prompt" --max-tokens "$2" --quiet >"$3" 2>&1
    fi
}
# The leader's latest "group collectives" line -> "AR_CALLS AR_MS AG_CALLS AG_MS BC_CALLS BC_MS
# AR_FLOATS AG_FLOATS BC_FLOATS".
counters() {
    grep "group collectives:" "$PL_WORK/$1.0.log" | tail -1 |
        sed 's/.*all-reduce \([0-9]*\) calls \([0-9]*\) floats \([0-9.]*\) ms, all-gather \([0-9]*\) calls \([0-9]*\) floats \([0-9.]*\) ms, broadcast \([0-9]*\) calls \([0-9]*\) floats \([0-9.]*\) ms.*/\1 \3 \4 \6 \7 \9 \2 \5 \8/'
}
count_lines() { grep -c "group collectives:" "$PL_WORK/$1.0.log"; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

# cpu_ms TAG: each rank's CPU time so far (user + system, /proc/PID/stat), in ms.
tick_ms=$((1000 / $(getconf CLK_TCK)))
cpu_ms() {
    local pid
    for pid in ${ranks[$1]}; do
        awk -v t="$tick_ms" '{ sub(/^.*\) /, ""); print ($12 + $13) * t }' "/proc/$pid/stat"
    done | tr '\n' ' '
}

# per I: counter I per extra token, (after - mid) - (mid - before) over N tokens.
per() {
    awk -v a="${after[$1]}" -v m="${mid[$1]}" -v b="${before[$1]}" -v n="$N" \
        'BEGIN { printf "%.2f", ((a - m) - (m - b)) / n }'
}
for tag in $configs; do
    client "$tag" 4 "$PL_WORK/warm" || pl_fail "$tag: warm-up failed: $(cat "$PL_WORK/warm")"
done
declare -A rate arc arms agc bcc loads cpu0 cpu1 agms arf agf bcf
for ((rep = 0; rep < repeat; rep++)); do
    for tag in $configs; do
        loads[$tag]="${loads[$tag]:-} $(cut -d' ' -f1 /proc/loadavg)"
        before=()
        mid=()
        after=()
        [ "$tag" = tp1 ] || { n0=$(count_lines "$tag"); read -ra before <<<"$(counters "$tag")"; }
        read -ra cb <<<"$(cpu_ms "$tag")"
        client "$tag" "$short" "$PL_WORK/one" || pl_fail "$tag: request failed: $(cat "$PL_WORK/one")"
        read -ra cm <<<"$(cpu_ms "$tag")"
        if [ "$tag" != tp1 ]; then
            pl_wait_log "$PL_WORK/$tag.0.log" "group collectives:" $((n0 + 1)) 10 || pl_fail "$tag: no counters"
            read -ra mid <<<"$(counters "$tag")"
        fi
        client "$tag" $((short + N)) "$PL_WORK/one" || pl_fail "$tag: request failed: $(cat "$PL_WORK/one")"
        rate[$tag]="${rate[$tag]:-} $(sed -n 's/^request 0: .* \([0-9.]*\) tokens\/s$/\1/p' "$PL_WORK/one")"
        read -ra ca <<<"$(cpu_ms "$tag")"
        cpu_per() { awk -v a="${ca[$1]}" -v m="${cm[$1]}" -v b="${cb[$1]}" -v n="$N" \
            'BEGIN { printf "%.1f", ((a - m) - (m - b)) / n }'; }
        cpu0[$tag]="${cpu0[$tag]:-} $(cpu_per 0)"
        [ "$tag" = tp1 ] || cpu1[$tag]="${cpu1[$tag]:-} $(cpu_per 1)"
        [ "$tag" = tp1 ] && continue
        pl_wait_log "$PL_WORK/$tag.0.log" "group collectives:" $((n0 + 2)) 10 || pl_fail "$tag: no counters"
        read -ra after <<<"$(counters "$tag")"
        arc[$tag]="${arc[$tag]:-} $(per 0)"
        arms[$tag]="${arms[$tag]:-} $(per 1)"
        agc[$tag]="${agc[$tag]:-} $(per 2)"
        bcc[$tag]="${bcc[$tag]:-} $(per 4)"
        agms[$tag]="${agms[$tag]:-} $(per 3)"
        arf[$tag]="${arf[$tag]:-} $(per 6)"
        agf[$tag]="${agf[$tag]:-} $(per 7)"
        bcf[$tag]="${bcf[$tag]:-} $(per 8)"
    done
    echo "bench tp: round $((rep + 1))/$repeat done" >&2
done

# --moe: per decoded token, wall ms, each rank's CPU ms, and every collective's calls / KB / ms.
moe_report() {
    local fmt="%-11s %-8s %-19s %-10s %-30s %-30s %-14s\n" tag w c0 c1
    echo "TP MoE benchmark: $(tr -d '\n' <"$model/config.json" | sed 's/.*"hidden_size": \([0-9]*\).*"moe_intermediate_size": \([0-9]*\), "num_experts": \([0-9]*\), "num_experts_per_tok": \([0-9]*\).*"num_hidden_layers": \([0-9]*\).*/hidden \1, \5 layers, \3 experts top-\4 of \2/'), vocab 151936, tied"
    echo "random bf16 checkpoint at $model; $plen prompt ids, $N decoded tokens per measured request,"
    echo "1 thread per rank, TP 2 on shared memory, $(nproc) cores (shared: 1-min load per round$(echo "${loads[tp1]}")), median of $repeat rounds"
    printf "$fmt" config "wall ms" "CPU ms/rank (0 / 1)" imbalance "all-reduce calls/KB/ms" \
        "all-gather calls/KB/ms" "broadcasts"
    kb() { awk -v f="$1" 'BEGIN { printf "%.1f", f * 4 / 1024 }'; }
    for tag in $configs; do
        w=$(awk -v r="$(echo "${rate[$tag]}" | median)" 'BEGIN { printf "%.1f", 1000 / r }')
        c0=$(echo "${cpu0[$tag]}" | median)
        if [ "$tag" = tp1 ]; then
            printf "$fmt" tp1 "$w" "$c0" - - - -
            continue
        fi
        c1=$(echo "${cpu1[$tag]}" | median)
        printf "$fmt" "$tag" "$w" "$c0 / $c1" \
            "$(awk -v x="$c0" -v y="$c1" 'BEGIN { printf "%.2f", (x > y ? x / y : y / x) }')" \
            "$(echo "${arc[$tag]}" | median) / $(kb "$(echo "${arf[$tag]}" | median)") / $(echo "${arms[$tag]}" | median)" \
            "$(echo "${agc[$tag]}" | median) / $(kb "$(echo "${agf[$tag]}" | median)") / $(echo "${agms[$tag]}" | median)" \
            "$(echo "${bcc[$tag]}" | median)"
    done
    echo "Per decoded token (the long request minus the short one, over the $N extra tokens). imbalance ="
    echo "the busier rank's CPU over the other's; KB are the leader's floats x 4 bytes; ms are the leader's"
    echo "wall time inside the calls (transfer plus waiting for the other rank). Each round's wall ms, then"
    echo "CPU ms of rank 0 (rank 1):"
    for tag in $configs; do
        echo "  $tag:$(for r in ${rate[$tag]}; do awk -v r="$r" 'BEGIN { printf " %.1f", 1000 / r }'; done);" \
            "CPU${cpu0[$tag]}${cpu1[$tag]:+ (${cpu1[$tag]# })}"
    done
}
if [ "$moe" = 1 ]; then
    moe_report
    exit 0
fi

cfg=$(tr -d '\n ' <"$model/config.json" | sed 's/.*"hidden_size":\([0-9]*\).*"num_hidden_layers":\([0-9]*\).*/hidden \1, \2 layers/')
echo "TP benchmark: Qwen3-0.6B-shaped random bf16 checkpoint ($cfg, vocab 151936, tied) at $model;"
echo "$plen prompt ids, $N decoded tokens per measured request, 1 thread per rank, $(nproc) cores" \
    "(shared: median 1-min load $(echo "${loads[tp1]}" | median)), median of $repeat rounds"
fmt="%-10s %-6s %-13s %-8s %-17s %-20s %-14s %-13s %-19s %-9s\n"
printf "$fmt" config ranks "decode tok/s" "vs TP 1" "all-reduce/token" "all-reduce ms/token" \
    "us/all-reduce" "gathers+bcasts" "CPU ms/token/rank" "CPU ratio"
base=$(echo "${rate[tp1]}" | median)
cpu_base=$(echo "${cpu0[tp1]}" | median)
for tag in $configs; do
    r=$(echo "${rate[$tag]}" | median)
    ratio=$(awk -v a="$r" -v b="$base" 'BEGIN { printf "%.2fx", a / b }')
    if [ "$tag" = tp1 ]; then
        printf "$fmt" tp1 1 "$r" 1.00x - - - - "$cpu_base" 1.00x
    else
        c=$(echo "${arc[$tag]}" | median)
        ms=$(echo "${arms[$tag]}" | median)
        c0=$(echo "${cpu0[$tag]}" | median)
        c1=$(echo "${cpu1[$tag]}" | median)
        printf "$fmt" "$tag" 2 "$r" "$ratio" "$c" "$(awk -v m="$ms" 'BEGIN { printf "%.3f", m }')" \
            "$(awk -v m="$ms" -v c="$c" 'BEGIN { printf "%.1f", (c > 0 ? m * 1000 / c : 0) }')" \
            "$(awk -v g="$(echo "${agc[$tag]}" | median)" -v b="$(echo "${bcc[$tag]}" | median)" 'BEGIN { printf "%.1f + %.1f", g, b }')" \
            "$c0 / $c1" "$(awk -v a="$cpu_base" -v x="$c0" -v y="$c1" 'BEGIN { printf "%.2fx", a / (x > y ? x : y) }')"
    fi
done
[ -n "$hosts_note" ] && echo "tp2_hosts: skipped: $hosts_note"
echo "TP 2 / TP 1 anchor: distributed-llama 1.46x at 2 nodes (1.90x at 4, 7B model); goal >= 1.7x at TP 2."
echo "vs TP 1 is the wall-clock ratio. The all-reduce time is the leader's, inside the call: the"
echo "transfer plus waiting for the other rank to arrive. CPU ms/token/rank is each rank's own CPU time"
echo "per decoded token (leader / follower; a rank waiting in a collective sleeps), and CPU ratio = TP 1's"
echo "over the busier TP 2 rank's: the split of the compute, which a host shared with other work"
echo "distorts far less than the wall clock (on $(nproc) shared cores, TP 1 runs on one, TP 2 on two)."
