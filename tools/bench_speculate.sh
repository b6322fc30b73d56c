#!/usr/bin/env bash
# Speculative decoding benchmark (not a test; the exactness checks are tests): one stream's
# decode tokens/s through 1, 2 and 4 stages, each stage on its own network-namespace host, with
# every link delayed 0.1, 1 and 5 ms one way (tc netem where the kernel has it, else the
# tests' userspace tun_link emulator), for
#   - no drafts (the reference; at 1 stage it is one process),
#   - n-gram drafts (strata-stage --speculate ngram: model-free, from the sequence itself),
#   - draft-model drafts (strata-stage --draft-model): the model's own first BENCH_DRAFT_LAYERS
#     layers with its embedding, norm and head (strata-stage-bench make-draft), a real smaller
#     model with the same vocabulary whose forward stage 0 pays on every draft (no trained pair
#     of random checkpoints exists; how often it agrees is whatever it is, printed),
#   - oracle drafts at acceptance 1.0, 0.8, 0.6 and 0.4 (strata-stage --speculate-oracle: the
#     tokens of the reference run, each replaced by a wrong one at that rate, so P is each
#     draft's chance to be right; the "accepted" column is the share of drafts the last stage
#     took, lower, since the drafts after a wrong one are not), which measures the mechanism
#     apart from how well a random checkpoint predicts itself;
#   - on 2 and 4 stages, n-gram and oracle 0.8 drafts with BENCH_WAVES (default 3) decode
#     steps in flight (--speculate-waves: the later ones drafted on the guess that the ones
#     before them are accepted whole, so the stages work on one stream together);
#   - sampling at temperature 1 without drafts, with n-gram drafts (the random model rarely
#     repeats itself: what drafts that miss cost; stage 0 backs off after a miss) and with the
#     draft model (speculative sampling: a draft is kept with probability min(1, p/q)).
# Every run's tokens must equal the reference's (it says so, or stops); it prints acceptance,
# tokens per round (a round = one trip of the ring), tokens/s, and the speed-up over the same
# pipeline without drafts and over one process without drafts.
# The model: a random-weight Qwen3 checkpoint generated once (H=1024, 8 layers, the one
# `./strata bench pipeline` uses) unless BENCH_MODEL names a model directory.
# Needs root and network namespaces (else "skipped: ..." and exit 0).
# Env: BENCH_MODEL, BENCH_THREADS (per stage, default 1), BENCH_TOKENS (default 64), BENCH_K
# (drafts per step, default 4), BENCH_DRAFT_LAYERS (the draft model's layers, default 2),
# BENCH_DELAYS_MS (default "0.1 1 5"), BENCH_STAGES (default
# "1 2 4"), BENCH_ORACLE (acceptances, default "1.0 0.8 0.6 0.4 0.0": 0.0, every draft wrong, is the mechanism's worst case), STRATA_BAZEL_FLAGS.
set -u
cd "$(dirname "$0")/.."
. tools/bench_build.sh
bench_build //runtime:strata-stage //runtime:strata-client //runtime:strata-stage-bench \
    //tests/pipeline:tun_link
. tests/pipeline/netns_lib.sh
nl_init 4
BENCH="$STRATA_BIN_DIR/runtime/strata-stage-bench"
T=${BENCH_THREADS:-1}
N=${BENCH_TOKENS:-64}
K=${BENCH_K:-4}
WAVES=${BENCH_WAVES:-3}
model=${BENCH_MODEL:-}
if [ -z "$model" ]; then
    model="${TMPDIR:-/tmp}/strata-bench-model"
    [ -f "$model/model.safetensors" ] || "$BENCH" make-model --out "$model" >/dev/null ||
        pl_fail "cannot generate the benchmark model"
fi
DL=${BENCH_DRAFT_LAYERS:-2}
draft="$PL_WORK/draft-$DL"
"$BENCH" make-draft --from "$model" --layers "$DL" --out "$draft" >/dev/null ||
    pl_fail "cannot make the draft model"
prompt=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16
opts=(--threads "$T" --max-seq 512 --max-batch 2 --insecure)
if nl_netem_available; then mech="tc netem"; else mech="tun_link (userspace; no netem here)"; fi
nl_tun_available >/dev/null 2>&1 || [ "$mech" = "tc netem" ] ||
    nl_skip "no netem and no /dev/net/tun: $(cat "$PL_WORK/tun.err")"

# links DELAY_MS: every host's link (the client's too) delayed DELAY_MS one way.
links() { nl_delay_all "$1" 0 1 2 3 c; }

rate() { sed -n 's/^request 0: .* \([0-9.]*\) tokens\/s$/\1/p' "$1"; }
# accepted DRAFTED: stage 0's line for the last finished request.
drafts_of() { grep "finished" "$1" | tail -n 1 | sed -n 's/.* \([0-9]*\) of \([0-9]*\) draft tokens accepted.*/\1 \2/p'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }'; }

# run TAG S LABEL CLIENT_OPTS -- STAGE_OPTS: one request of N tokens; a table row.
runs=0
run() {
    local tag=$1$((runs += 1)) S=$2 label=$3 copts=() sopts=()
    shift 3
    while [ $# -gt 0 ] && [ "$1" != -- ]; do copts+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    sopts=("$@")
    nl_start_pipeline "$tag" "$S" "$model" "${opts[@]}" "${sopts[@]}"
    nl_client --prompt "$prompt" --max-tokens "$N" --insecure "${copts[@]}" \
        >"$PL_WORK/$tag.client" 2>>"$PL_WORK/$tag.client.err" ||
        pl_fail "$tag: client failed: $(cat "$PL_WORK/$tag.client")"
    pl_stop_pipeline "$tag" "$S"
    local got r acc="-" per="1.00" a d
    got=$(pl_tokens_of "$PL_WORK/$tag.client" 0)
    r=$(rate "$PL_WORK/$tag.client")
    local sampled=0
    case " ${copts[*]} " in *" --temperature "*) sampled=1 ;; esac
    if [ "$sampled" = 1 ]; then
        [ -z "${want_t:-}" ] && want_t=$got
        [ "$got" = "$want_t" ] || pl_fail "$tag: sampled tokens differ from the run without drafts"
    else
        if [ -z "${want:-}" ]; then
            want=$got
            printf '%s %s\n' "$prompt" "$got" >"$PL_WORK/oracle.txt"
        fi
        [ "$got" = "$want" ] || pl_fail "$tag: tokens differ from the run without drafts: $got vs $want"
    fi
    read -r a d <<<"$(drafts_of "$PL_WORK/$tag.0.log")"
    if [ -n "${d:-}" ] && [ "$d" -gt 0 ]; then
        acc=$(awk -v a="$a" -v d="$d" 'BEGIN { printf "%.2f", a / d }')
        per=$(awk -v a="$a" -v n="$N" 'BEGIN { printf "%.2f", (n - 1) / (n - 1 - a) }')
        # With several steps in flight a trip carries several steps, and the accepted drafts
        # count the later steps' confirmed guesses: tokens per trip is not read from them.
        case "$label" in *" w"[0-9]*) per="-" ;; esac
    fi
    case "$label" in
        none) base=$r; [ "$S" = 1 ] && one=$r ;;
        "none T=1") base_t=$r; [ "$S" = 1 ] && one_t=$r ;;
    esac
    local b=$base o=$one
    [ "$sampled" = 1 ] && b=$base_t && o=$one_t
    printf '%-2s %-12s %9s %9s %9s %10s %12s  same tokens\n' "$S" "$label" "$acc" "$per" "$r" \
        "$(ratio "$r" "$b")" "$(ratio "$r" "$o")"
}

echo "bench speculate: one stream of $N tokens, $T thread(s) per stage, k = $K drafts per step;"
echo "model $model; draft model: its first $DL layers; links: $mech"
lscpu | sed -n 's/^Model name: *//p' | head -n 1
for delay in ${BENCH_DELAYS_MS:-0.1 1 5}; do
    links "$delay"
    echo
    echo "links $delay ms one way (every hop, the client's too):"
    printf '%-2s %-12s %9s %9s %9s %10s %12s\n' S drafts accepted tok/round tokens/s \
        "vs no-spec" "vs 1 process"
    one="" one_t=""
    for S in ${BENCH_STAGES:-1 2 4}; do
        base="" base_t=""
        run "n$S" "$S" none --speculate off
        run "g$S" "$S" ngram --speculate ngram --speculate-k "$K"
        run "d$S" "$S" "draft ${DL}L" -- --draft-model "$draft" --speculate-k "$K"
        for p in ${BENCH_ORACLE:-1.0 0.8 0.6 0.4 0.0}; do
            run "o$S" "$S" "oracle $p" -- --speculate-oracle "$PL_WORK/oracle.txt:$p" \
                --speculate-k "$K"
        done
        if [ "$S" -gt 1 ]; then # several decode steps in flight (--speculate-waves)
            run "w$S" "$S" "ngram w${WAVES}" -- --speculate ngram --speculate-k "$K" \
                --speculate-waves "$WAVES"
            run "v$S" "$S" "oracle .8 w${WAVES}" -- --speculate-oracle "$PL_WORK/oracle.txt:0.8" \
                --speculate-k "$K" --speculate-waves "$WAVES"
        fi
        run "t$S" "$S" "none T=1" --speculate off --temperature 1 --seed 5
        run "u$S" "$S" "ngram T=1" --speculate ngram --speculate-k "$K" --temperature 1 --seed 5
        run "e$S" "$S" "draft${DL}L T=1" --temperature 1 --seed 5 -- --draft-model "$draft" \
            --speculate-k "$K"
    done
done
[ -n "${NL_TUN_LINK_PID:-}" ] && nl_tun_link_stop
exit 0
