#!/usr/bin/env bash
# Pipeline benchmark (not a test): a single strata-stage process vs 2 and 4 stages on
# loopback with the same model, printing
#   - decode tokens/s of one request and the ratio to the single process (goal >= 0.95),
#   - aggregate tokens/s with S concurrent requests (and the single process with S requests),
#   - the same decode ratio for the 4-stage ring over TLS 1.3 (PSK, --auth-key-file), and
#   - per-hop latency p50/p99 of one decode hidden state (goal p50 <= 60 us), measured two
#     ways: a ping-pong of real Activation frames over TCP loopback (strata-stage-bench hop:
#     build, send, receive, verify, decode; one hop = RTT / 2), and through real strata-stage
#     processes (inter-token gap of a 4-stage ring minus one stage, over 4 hops, tiny model);
#     both plaintext (--insecure) and over TLS 1.3 with a pre-shared key.
# The committed goldens are too small for timing (a step is microseconds, so messaging would
# dominate), so a random-weight Qwen3 checkpoint is generated once (default H=1024, 8 layers,
# ~200 MB bf16) unless BENCH_MODEL names a model directory.
# Threads: every stage process gets --threads T (T = BENCH_THREADS, default nproc). With one
# request only the stage holding its token computes, so T threads run at a time in every
# configuration. BENCH_SPLIT_THREADS=1 gives each of S stages max(1, T/S) threads instead
# (the same total threads), which on a machine with fewer cores than stages is the fairer
# comparison for concurrent requests.
# The three pipelines run side by side and the measurements are interleaved; each figure is
# the median of BENCH_REPEAT (default 5) rounds, as the host may be shared.
# Layers: --split decode (BENCH_SPLIT, default decode; even for the same layer count): each
# stage streams about as many weight bytes per token, the last stage's lm_head counted, so no
# stage sets a slower pace than the others (strata-plan --split decode prints the ranges).
# BENCH_LOAD=prefill (default decode: all of the above) measures a prefill-heavy load
# instead: W x S concurrent requests (W = BENCH_PREFILL_WAVES, default 4: at least S stay in
# flight while the pipeline fills and drains, which S one-shot prompts would dominate: S
# single-chunk prompts through S stages can reach only S^2 / (2S - 1) x) of
# BENCH_PROMPT_TOKENS (default 256) distinct prompt ids and 1 generated token each, on S = 2
# and 4 stages and on one process serving the same requests, every stage and the single
# process on 1 thread. Decode is memory-bound, so one
# process batches S decoding requests nearly for free and no pipeline on one host reaches S x
# there; a prefill's cost grows with its rows, so this is where the issue's goal (S stages
# with S requests in flight >= 0.9 x S x one process) can be measured. It prints aggregate
# prompt tokens/s (S x prompt tokens / the last request's first-token time, from
# strata-client's "first token ... ms" lines: the time until every prompt is prefilled and
# its token sampled), the single process's figure and "% of S x single process"; medians of
# BENCH_REPEAT interleaved rounds; --split even unless BENCH_SPLIT says otherwise (prefill
# computes layers: the lm_head runs on one row per request).
# Env: BENCH_MODEL, BENCH_THREADS, BENCH_TOKENS (default 48), BENCH_SPLIT_THREADS, BENCH_REPEAT,
# BENCH_SPLIT, BENCH_LOAD (decode or prefill), BENCH_PROMPT_TOKENS (prefill, default 256),
# BENCH_PREFILL_WAVES (prefill, 1 to 4, default 4), BENCH_PREFILL_STAGES (prefill: the S to
# measure, of 2 4 8, default "2 4"; "2 4 8" on a host with 8 or more cores),
# STRATA_BAZEL_FLAGS (extra flags for bazel build, e.g. --define=strata_cuda=0), STRATA_PREBUILT
# (a directory laid out as bazel-bin holding the binaries: no build; the GPU bundle's).
set -u
case "${BENCH_LOAD:-decode}" in
    decode | prefill) ;;
    *)
        echo "bench_pipeline: BENCH_LOAD is decode or prefill, not '${BENCH_LOAD}'" >&2
        exit 2
        ;;
esac
cd "$(dirname "$0")/.."
. tools/bench_build.sh
bench_build //runtime:strata-stage //runtime:strata-client //runtime:strata-stage-bench
. tests/pipeline/pipeline_lib.sh
pl_init
BENCH="$STRATA_BIN_DIR/runtime/strata-stage-bench"
T=${BENCH_THREADS:-$(nproc)}
N=${BENCH_TOKENS:-48}
model=${BENCH_MODEL:-}
if [ -z "$model" ]; then
    model="${TMPDIR:-/tmp}/strata-bench-model"
    [ -f "$model/model.safetensors" ] || "$BENCH" make-model --out "$model" >/dev/null ||
        pl_fail "cannot generate the benchmark model"
fi
hidden=$(sed -n 's/.*"hidden_size": *\([0-9]*\).*/\1/p' "$model/config.json")
prompts=(1,2,3,4,5,6,7,8 9,10,11,12,13,14,15,16 17,18,19,20,21,22,23,24 25,26,27,28,29,30,31,32)

decode_rate() { sed -n 's/^request 0: .* \([0-9.]*\) tokens\/s$/\1/p' "$1"; }
aggregate_rate() { sed -n 's/^total: .* = \([0-9.]*\) tokens\/s$/\1/p' "$1"; }
# prefill_rate FILE TOKENS: TOKENS / the latest "first token ... ms" of FILE's requests.
prefill_rate() {
    sed -n 's/^request [0-9]*: .*, first token \([0-9.]*\) ms, .*/\1/p' "$1" | sort -g | tail -n 1 |
        awk -v t="$2" '{ printf "%.1f", t / ($1 / 1000) }'
}

layers=$(grep -o '"num_hidden_layers": *[0-9]*' "$model/config.json" | tr -d '"')
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
threads_for() {
    if [ "${BENCH_SPLIT_THREADS:-0}" = 1 ]; then
        local t=$((T / $1))
        echo $((t >= 1 ? t : 1))
    else
        echo "$T"
    fi
}
many_args() { # many_args K: K different prompts
    local i
    for ((i = 0; i < $1; i++)); do printf -- "--prompt %s " "${prompts[$i]}"; done
}

# BENCH_LOAD=prefill (see the top): S requests of P prompt ids, 1 generated token, 1 thread.
bench_prefill() {
    local P=${BENCH_PROMPT_TOKENS:-256} W=${BENCH_PREFILL_WAVES:-4} split=${BENCH_SPLIT:-even}
    local stages=${BENCH_PREFILL_STAGES:-2 4}
    local S K rep r a b of vocab max_seq kmax=0
    [[ "$P" =~ ^[1-9][0-9]*$ ]] || pl_fail "BENCH_PROMPT_TOKENS must be a positive count, not '$P'"
    [[ "$W" =~ ^[1-4]$ ]] || pl_fail "BENCH_PREFILL_WAVES must be 1 to 4, not '$W'"
    for S in $stages; do
        [[ "$S" =~ ^(2|4|8)$ ]] || pl_fail "BENCH_PREFILL_STAGES lists 2, 4 or 8, not '$S'"
        [ "$S" -le "$(sed -n 's/.*"num_hidden_layers": *\([0-9]*\).*/\1/p' "$model/config.json")" ] ||
            pl_fail "$S stages need at least $S layers in $model"
        [ "$S" -gt "$kmax" ] && kmax=$S
    done
    vocab=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$model/config.json")
    max_seq=$((P + 16 > 512 ? P + 16 : 512))
    echo "pipeline benchmark, prefill load: $layers, hidden $hidden, $W x S requests of $P prompt" \
        "tokens and 1 generated token each, sent at once, $(nproc) cores, 1 thread per stage and" \
        "1 thread for the single process, --split $split"
    local reqs=() # reqs[r]: request r's prompt, distinct ids (r * P ...) below the vocabulary
    for ((r = 0; r < kmax * W; r++)); do
        reqs[r]=$(seq $((r * P)) $((r * P + P - 1)) |
            awk -v v="$vocab" '{ printf "%s%d", (NR > 1 ? "," : ""), $1 % (v - 1) + 1 }')
    done
    for S in 1 $stages; do
        # --no-prefix-cache: every round sends the same prompts, which a cache would
        # otherwise serve from the second on (on 16 cores that read as 5561 prompt tok/s for
        # one thread); this measures prefill itself.
        pl_start_pipeline "p$S" "$S" "$model" --threads 1 --max-seq "$max_seq" --max-batch $((kmax * W)) \
            --split "$split" --insecure --no-prefix-cache
        pl_client "p$S" --prompt "${reqs[0]}" --max-tokens 1 --quiet --insecure >/dev/null 2>&1 ||
            pl_fail "warm-up on $S stages failed"
    done
    declare -A pre
    for ((rep = 0; rep < ${BENCH_REPEAT:-5}; rep++)); do
        for K in $stages; do
            for S in 1 "$K"; do
                local args=()
                for ((r = 0; r < K * W; r++)); do args+=(--prompt "${reqs[r]}"); done
                pl_client "p$S" "${args[@]}" --max-tokens 1 --quiet --insecure >"$PL_WORK/pre" 2>&1 ||
                    pl_fail "$((K * W)) prefills on $S stages failed: $(cat "$PL_WORK/pre")"
                pre[$S.$K]="${pre[$S.$K]:-} $(prefill_rate "$PL_WORK/pre" $((K * W * P)))"
            done
        done
    done
    for S in 1 $stages; do
        pl_stop_pipeline "p$S" "$S"
    done
    printf "%-7s %-9s %-24s %-25s %-14s\n" stages requests "prompt tok/s, S stages" \
        "prompt tok/s, 1 process" "of S x 1 process"
    for S in $stages; do
        a=$(echo "${pre[$S.$S]}" | median)
        b=$(echo "${pre[1.$S]}" | median)
        of=$(awk -v a="$a" -v b="$b" -v s="$S" 'BEGIN { printf "%.0f%%", 100 * a / (s * b) }')
        [ "$S" -le "$(nproc)" ] || of="$of (*)"
        printf "%-7s %-9s %-24s %-25s %-14s\n" "$S" "$((S * W))" "$a" "$b" "$of"
    done
    echo "goal: >= 90% of S x the single process with S requests in flight" \
        "((*): more stages than the $(nproc) cores here, so stages share cores: not a measure of S x)"
}

if [ "${BENCH_LOAD:-decode}" = prefill ]; then
    bench_prefill
    exit 0
fi
echo "pipeline benchmark: $layers, hidden $hidden," \
    "$N tokens per request, $(nproc) cores, threads per stage: $([ "${BENCH_SPLIT_THREADS:-0}" = 1 ] && echo "T/S of $T" || echo "$T"), --split ${BENCH_SPLIT:-decode}"

# All three pipelines run side by side (idle stages only wait in poll) and the measurements
# are interleaved round by round, so drifting load on a shared host hits every
# configuration alike; each figure is the median over BENCH_REPEAT rounds.
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PL_WORK/key"
tls=(--auth-key-file "$PL_WORK/key") # TLS 1.3, external PSK
split=${BENCH_SPLIT:-decode}
for S in 1 2 4; do
    pl_start_pipeline "b$S" "$S" "$model" --threads "$(threads_for "$S")" --max-seq 512 --max-batch 8 \
        --split "$split" --insecure --stage-stats
    pl_client "b$S" --prompt "${prompts[0]}" --max-tokens 4 --quiet --insecure >/dev/null 2>&1 ||
        pl_fail "warm-up on $S stages failed"
done
pl_start_pipeline b4t 4 "$model" --threads "$(threads_for 4)" --max-seq 512 --max-batch 8 --split "$split" "${tls[@]}" \
    --stage-stats
pl_client b4t --prompt "${prompts[0]}" --max-tokens 4 --quiet "${tls[@]}" >/dev/null ||
    pl_fail "warm-up on 4 stages with TLS failed"
declare -A one agg
for ((rep = 0; rep < ${BENCH_REPEAT:-5}; rep++)); do
    for S in 1 2 4; do
        t0=$(date +%s.%N)
        pl_client "b$S" --prompt "${prompts[0]}" --max-tokens "$N" --quiet --insecure >"$PL_WORK/one" 2>&1 ||
            pl_fail "single request on $S stages failed: $(cat "$PL_WORK/one")"
        echo "$t0 $(date +%s.%N)" >>"$PL_WORK/windows.b$S"
        sleep 0.8 # the stages' --stage-stats line for this run comes 0.5 s after its end
        one[$S]="${one[$S]:-} $(decode_rate "$PL_WORK/one")"
        if [ "$S" = 4 ]; then
            t0=$(date +%s.%N)
            pl_client b4t --prompt "${prompts[0]}" --max-tokens "$N" --quiet "${tls[@]}" >"$PL_WORK/one" ||
                pl_fail "single request on 4 stages with TLS failed: $(cat "$PL_WORK/one")"
            echo "$t0 $(date +%s.%N)" >>"$PL_WORK/windows.b4t"
            sleep 0.8
            one[4t]="${one[4t]:-} $(decode_rate "$PL_WORK/one")"
        fi
        for K in 2 4; do
            [ "$S" = 1 ] || [ "$S" = "$K" ] || continue
            # shellcheck disable=SC2046
            pl_client "b$S" $(many_args "$K") --max-tokens "$N" --quiet --insecure >"$PL_WORK/many" 2>&1 ||
                pl_fail "$K concurrent requests on $S stages failed: $(cat "$PL_WORK/many")"
            agg[$S.$K]="${agg[$S.$K]:-} $(aggregate_rate "$PL_WORK/many")"
        done
    done
done
for S in 1 2 4; do
    pl_stop_pipeline "b$S" "$S"
done
pl_stop_pipeline b4t 4
single_rate=$(echo "${one[1]}" | median)
printf "%-7s %-9s %-16s %-10s %-24s %-22s %-14s\n" stages threads "decode tok/s" ratio \
    "aggregate tok/s, S req" "1 stage, S req" "of S x 1 stage"
for S in 1 2 4; do
    rate=$(echo "${one[$S]}" | median)
    ratio=$(awk -v a="$rate" -v b="$single_rate" 'BEGIN { printf "%.3f", a / b }')
    if [ "$S" = 1 ]; then
        printf "%-7s %-9s %-16s %-10s %-24s %-22s %-14s\n" 1 "$(threads_for 1)" "$rate" "1.000" "-" "-" "-"
    else
        a=$(echo "${agg[$S.$S]}" | median)
        b=$(echo "${agg[1.$S]}" | median)
        # The issue's goal: S stages serving S requests >= 0.9 x S x one process serving them.
        # Only a measurement of that when every stage thread has a core of its own.
        of=$(awk -v a="$a" -v b="$b" -v s="$S" 'BEGIN { printf "%.0f%%", 100 * a / (s * b) }')
        [ $((S * $(threads_for "$S"))) -le "$(nproc)" ] || of="$of (*)"
        printf "%-7s %-9s %-16s %-10s %-24s %-22s %-14s\n" "$S" "$(threads_for "$S")" "$rate" "$ratio" \
            "$a" "$b" "$of"
    fi
done
echo "(*) more stage threads than the $(nproc) cores here: stages share cores, so this is not a measure of S x"
rate=$(echo "${one[4t]}" | median)
printf "%-7s %-9s %-16s %-10s %-24s %-22s\n" "4 TLS" "$(threads_for 4)" "$rate" \
    "$(awk -v a="$rate" -v b="$single_rate" 'BEGIN { printf "%.3f", a / b }')" "-" "-"
echo "decode ratio goal: >= 0.95 of the single process (4 TLS: TLS 1.3 PSK on every link)"

# Where a token's time goes with one request, from the stages' --stage-stats lines written
# during the single-request runs or in the 0.8 s after each (a stage writes one when it has
# been idle for 0.5 s): each stage's compute per microbatch (one a token),
# and the token's period at stage 0 (its compute + sends + wait for the token to come round).
# period - the stages' compute summed = what the pipeline adds: hops, wake-ups, sends.
# stats TAG S -> "period_ms compute_sum_ms c0+c1+... send_sum_ms"
stats() {
    local tag=$1 S=$2 r
    for ((r = 0; r < S; r++)); do
        awk -v r="$r" 'NR == FNR { lo[NR] = $1; hi[NR] = $2; n = NR; next }
            /stage stats: / {
                ts = $3; sub(/\]$/, "", ts); ts += 0
                inside = 0
                for (i = 1; i <= n; i++) if (ts >= lo[i] && ts <= hi[i] + 0.8) inside = 1
                if (!inside) next
                m = $7 + 0; line = $0
                sub(/.*compute /, "", line); c = line + 0
                sub(/.*send /, "", line); s = line + 0
                sub(/.*next frame /, "", line); w = line + 0
                N += m; C += m * c; Sd += m * s; W += m * w
            }
            END { if (N) printf "%d %.1f %.1f %.1f\n", r, C / N, Sd / N, W / N }' \
            "$PL_WORK/windows.$tag" "$PL_WORK/$tag.$r.log"
    done | awk -v S="$S" '{ c[$1] = $2; s += $3; if ($1 == 0) { period = $2 + $3 + $4 } sum += $2; n++ }
        END { if (n < S) { print "-"; exit }
              list = ""; for (i = 0; i < S; i++) list = list (i ? "+" : "") sprintf("%.2f", c[i] / 1000)
              printf "%.2f %.2f %s %.2f\n", period / 1000, sum / 1000, list, s / 1000 }'
}
echo "where a token's time goes, one request (ms per token): the period from the decode rate above,"
echo "the stages' compute summed from their --stage-stats lines; what the split adds beyond its"
echo "compute is the hops, sends and wake-ups"
read -r _ c1 _ <<<"$(stats b1 1)"
p1=$(awk -v r="$single_rate" 'BEGIN { printf "%.3f", 1000 / r }')
for S in 1 2 4 4t; do
    read -r _ csum list _ <<<"$(stats "b$S" "${S%t}")"
    if [ -z "${csum:-}" ] || [ -z "${c1:-}" ]; then
        echo "  $S stages: no --stage-stats line from its runs (see the stage logs)"
        continue
    fi
    p=$(awk -v r="$(echo "${one[$S]}" | median)" 'BEGIN { printf "%.3f", 1000 / r }')
    awk -v S="$S" -v p="$p" -v c="$csum" -v l="$list" -v p1="$p1" -v c1="$c1" 'BEGIN {
        printf "  %-3s stages: period %6.2f (%+5.1f%%); compute %6.2f = %s (%+5.1f%%); hops and the rest %+.2f\n",
            S, p, 100 * (p - p1) / p1, c, l, 100 * (c - c1) / c1, (p - p1) - (c - c1) }'
done
for tls_mode in off psk; do
    "$BENCH" hop --hidden "$hidden" --tls "$tls_mode"
    [ "$hidden" = 4096 ] || "$BENCH" hop --hidden 4096 --tls "$tls_mode"
done

# The same through real strata-stage processes: on a tiny golden model (compute ~0.2 ms a
# token) the extra inter-token gap of a 4-stage ring over one stage is 4 hops.
tiny=$(pl_golden qwen3_gqa_tied)
gap() { sed -n 's/^request 0: inter-token gap p50 \([0-9.]*\) us, p99 \([0-9.]*\) us$/\1 \2/p' "$1"; }
for S in 1 4 4t; do
    if [ "$S" = 4t ]; then sec=("${tls[@]}"); else sec=(--insecure); fi
    pl_start_pipeline "t$S" "${S%t}" "$tiny" --max-seq 600 "${sec[@]}"
    pl_client "t$S" --prompt 38 --max-tokens 500 --quiet --latency "${sec[@]}" >"$PL_WORK/gap.$S" 2>/dev/null ||
        pl_fail "tiny model on $S stages failed"
    pl_stop_pipeline "t$S" "${S%t}"
done
read -r g1_50 _ <<<"$(gap "$PL_WORK/gap.1")"
read -r g4_50 _ <<<"$(gap "$PL_WORK/gap.4")"
read -r g4t_50 _ <<<"$(gap "$PL_WORK/gap.4t")"
awk -v a="$g1_50" -v b="$g4_50" -v c="$g4t_50" 'BEGIN {
    printf "per-hop latency through strata-stage processes (hidden 64; p50 inter-token gap of a 4-stage ring minus 1 stage, / 4): %.1f us plaintext, %.1f us TLS 1.3 PSK\n", (b - a) / 4, (c - a) / 4 }'
