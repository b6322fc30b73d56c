# Shell helpers for the pipeline integration tests, the demo and the pipeline benchmark:
# start strata-stage processes on free loopback ports (each writes its port to a file, and
# reads its next hop's port from the neighbour's file, so start order does not matter),
# wait for the ring to connect, run strata-client, and always kill every started process
# on exit. Source it, then call pl_init.

pl_fail() {
    echo "FAIL: $*" >&2
    pl_dump_logs >&2
    exit 1
}

pl_dump_logs() {
    [ -n "${PL_WORK:-}" ] || return 0
    for f in "$PL_WORK"/*.log; do
        [ -f "$f" ] || continue
        echo "---- $f (last 15 lines)"
        tail -n 15 "$f"
    done
}

pl_cleanup() {
    for p in $PL_PIDS; do
        kill -9 "$p" 2>/dev/null
    done
    for p in $PL_PIDS; do
        wait "$p" 2>/dev/null
    done
    PL_PIDS=""
}

# pl_init: finds the binaries (Bazel runfiles, else $STRATA_BIN_DIR/runtime, else the
# repository's bazel-bin/runtime) and makes a work directory.
pl_init() {
    if [ -n "${TEST_SRCDIR:-}" ] && [ -d "$TEST_SRCDIR/${TEST_WORKSPACE:-strata}" ]; then
        PL_ROOT="$TEST_SRCDIR/${TEST_WORKSPACE:-strata}"
        PL_BIN="$PL_ROOT/runtime"
    else
        PL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
        PL_BIN="${STRATA_BIN_DIR:-$PL_ROOT/bazel-bin}/runtime"
    fi
    PL_STAGE="$PL_BIN/strata-stage"
    PL_CLIENT="$PL_BIN/strata-client"
    [ -x "$PL_STAGE" ] || pl_fail "strata-stage not found at $PL_STAGE (build //runtime:strata-stage)"
    [ -x "$PL_CLIENT" ] || pl_fail "strata-client not found at $PL_CLIENT"
    PL_WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/pipeline.XXXXXX")"
    PL_PIDS=""
    trap pl_cleanup EXIT
    trap 'pl_cleanup; exit 1' INT TERM
}

# pl_make_text_model DIR: a tiny random checkpoint (2 layers, hidden 64, seed 11) with the real
# Qwen3 vocabulary and tokenizer files, made at test time, for tests that go through text.
pl_make_text_model() {
    "$PL_BIN/strata-stage-bench" make-model --out "$1" --vocab 151936 --hidden 64 --layers 2 \
        --intermediate 128 --heads 4 --kv-heads 2 --head-dim 16 --seed 11 >"$PL_WORK/make.log" 2>&1 ||
        pl_fail "make-model failed: $(cat "$PL_WORK/make.log")"
    cp "$PL_ROOT/tests/runtime/text/testdata/qwen3-tokenizer/tokenizer.json" \
        "$PL_ROOT/tests/runtime/text/testdata/qwen3-tokenizer/tokenizer_config.json" "$1/" ||
        pl_fail "cannot copy the tokenizer files"
}

pl_golden() { echo "$PL_ROOT/tests/golden/$1"; }

# Comma-separated prompt ids and generated ids of a golden case.
pl_golden_prompt() { tr -d '[] \n' <"$(pl_golden "$1")/prompt_ids.json"; }
pl_golden_generated() {
    sed -n '/"generated_ids"/,/\]/p' "$(pl_golden "$1")/golden.json" |
        tr -d '[]" \n' | sed 's/^generated_ids://; s/,$//'
}
pl_golden_steps() {
    sed -n 's/.*"n_steps": *\([0-9]*\).*/\1/p' "$(pl_golden "$1")/golden.json"
}

# pl_security_default [options...]: prints --insecure when neither the options nor
# $STRATA_AUTH_KEY choose the link security (strata-stage and strata-client refuse to start
# without a choice; most tests are about other things and run plaintext).
pl_security_default() {
    [ -n "${STRATA_AUTH_KEY:-}" ] && return 0
    local a
    for a in "$@"; do
        case "$a" in --insecure | --auth-key-file | --tls-cert | --tls-key | --tls-ca) return 0 ;; esac
    done
    echo --insecure
}

# pl_stage_cpus R: "--cpus LIST" for stage R where the caller pins stages (PL_STAGE_CPUS, an
# array of CPU lists by rank; an empty or missing entry leaves that stage unpinned).
pl_stage_cpus() {
    local list="${PL_STAGE_CPUS[$1]:-}"
    [ -z "$list" ] || echo "--cpus $list"
}

# pl_start_stage TAG S R MODEL_DIR [strata-stage options...]: stage R of pipeline TAG
# (plaintext, --insecure, unless the options or $STRATA_AUTH_KEY give a key or certificates;
# on PL_STAGE_CPUS[R] where that is set).
pl_start_stage() {
    local tag=$1 S=$2 r=$3 model=$4
    shift 4
    local next=$(((r + 1) % S))
    rm -f "$PL_WORK/$tag.$r.port"
    # shellcheck disable=SC2046
    "$PL_STAGE" --model "$model" --num-stages "$S" --stage-idx "$r" \
        --port-file "$PL_WORK/$tag.$r.port" --next-port-file "$PL_WORK/$tag.$next.port" \
        $(pl_stage_cpus "$r") $(pl_security_default "$@") "$@" >>"$PL_WORK/$tag.$r.out" 2>>"$PL_WORK/$tag.$r.log" &
    local pid=$!
    PL_PIDS="$PL_PIDS $pid"
    eval "PL_PID_${tag}_$r=$pid"
}

pl_pid() { eval "echo \$PL_PID_$1_$2"; }

# pl_kill_stage TAG R: SIGKILL to stage R of TAG (a crash, as its supervisor would see it),
# reaped quietly.
pl_kill_stage() {
    kill -9 "$(pl_pid "$1" "$2")" 2>/dev/null
    { wait "$(pl_pid "$1" "$2")"; } 2>/dev/null
}

# pl_log_secs FILE PATTERN: the time stamp ("[stage r SECS.MS]", seconds) of FILE's first
# line matching PATTERN; empty when there is none.
pl_log_secs() {
    grep -m1 -- "$2" "$1" | sed -n 's/^\[stage [0-9]* \([0-9.]*\)\].*/\1/p'
}

# pl_kill_and_restart TAG S R MODEL_DIR DELAY_S [strata-stage options...]: after DELAY_S
# (the clients mid-request), kills stage R of TAG and starts it again with the options (as
# its supervisor would), waits for stage 0 to log a recovered request, and prints the
# seconds from the kill to stage 0's first token after the replay (the recovery tests).
pl_kill_and_restart() {
    local tag=$1 S=$2 r=$3 model=$4 delay=$5 killed_at at
    shift 5
    sleep "$delay"
    killed_at=$(date +%s.%N) # before the kill: never under-reports
    pl_kill_stage "$tag" "$r"
    pl_start_stage "$tag" "$S" "$r" "$model" "$@"
    pl_wait_log "$PL_WORK/$tag.0.log" "recovered: " 1 20 || pl_fail "$tag: no recovery logged"
    at=$(pl_log_secs "$PL_WORK/$tag.0.log" "recovered: ")
    echo "$tag: stage $r killed and restarted; first token after the replay $(pl_secs_between "$killed_at" "$at") s after the kill"
}

# pl_check_same TAG: the tokens of TAG's two clients ($PL_WORK/TAG.greedy and TAG.sampled,
# two requests each) equal those of the undisturbed run ($PL_WORK/one.greedy, one.sampled).
pl_check_same() {
    local which k want got
    for which in greedy sampled; do
        for k in 0 1; do
            want=$(pl_tokens_of "$PL_WORK/one.$which" $k)
            got=$(pl_tokens_of "$PL_WORK/$1.$which" $k)
            if [ -z "$want" ] || [ "$got" != "$want" ]; then
                pl_fail "$1: $which request $k: tokens $got, undisturbed $want"
            fi
        done
    done
    echo "$1: all 4 requests (2 greedy, 2 sampled) completed with the undisturbed tokens"
}

# pl_reference_run MODEL_DIR PROMPT GREEDY SAMPLED [strata-stage options...]: the recovery
# tests' undisturbed run on one stage (tag "one"). GREEDY and SAMPLED name the caller's
# arrays of strata-client options (two requests each): their output goes to
# $PL_WORK/one.greedy and one.sampled (what pl_check_same compares against); then one request
# of PROMPT for 150 tokens into $PL_WORK/one.single, whose --out (tokens + every logit) is
# copied to $PL_WORK/ref.safetensors. The stage stops at the end.
pl_reference_run() {
    local model=$1 prompt=$2
    local -n pl_ref_greedy=$3 pl_ref_sampled=$4
    shift 4
    pl_start_pipeline one 1 "$model" "$@" --out "$PL_WORK/one.safetensors"
    pl_client one "${pl_ref_greedy[@]}" >"$PL_WORK/one.greedy" ||
        pl_fail "reference: $(cat "$PL_WORK/one.greedy")"
    pl_client one "${pl_ref_sampled[@]}" >"$PL_WORK/one.sampled" ||
        pl_fail "reference: $(cat "$PL_WORK/one.sampled")"
    pl_client one --prompt "$prompt" --max-tokens 150 >"$PL_WORK/one.single" ||
        pl_fail "reference single: $(cat "$PL_WORK/one.single")"
    # --out holds the last finished request, and the stage writes it after the client has its
    # last token: wait for the 5th request's write (the file exists from the first), or the
    # copy may be the previous request's --out and a comparison with it fails.
    pl_wait_log "$PL_WORK/one.0.log" "wrote $PL_WORK/one.safetensors" 5 5 ||
        pl_fail "single stage: the 5th request's --out was not written"
    cp "$PL_WORK/one.safetensors" "$PL_WORK/ref.safetensors"
    pl_stop_pipeline one 1
}

# pl_wait_log FILE PATTERN COUNT TIMEOUT_S: waits for COUNT lines matching PATTERN.
pl_wait_log() {
    local file=$1 pattern=$2 count=$3 timeout=$4 i=0
    while [ "$i" -lt $((timeout * 20)) ]; do
        if [ -f "$file" ] && [ "$(grep -c -- "$pattern" "$file")" -ge "$count" ]; then
            return 0
        fi
        sleep 0.05
        i=$((i + 1))
    done
    return 1
}

# pl_start_pipeline TAG S MODEL_DIR [options for every stage...] (--out is written by the
# last stage only, so it may be given to all).
pl_start_pipeline() {
    local tag=$1 S=$2 model=$3 r
    shift 3
    for ((r = 0; r < S; r++)); do
        pl_start_stage "$tag" "$S" "$r" "$model" "$@"
    done
    pl_wait_ready "$tag" "$S"
}

# pl_wait_ready TAG S: every stage listening and, for S > 1, every hop connected.
pl_wait_ready() {
    local tag=$1 S=$2 r
    for ((r = 0; r < S; r++)); do
        pl_wait_log "$PL_WORK/$tag.$r.log" "listening on" 1 20 ||
            pl_fail "stage $r of $tag did not start"
        if [ "$S" -gt 1 ]; then
            pl_wait_log "$PL_WORK/$tag.$r.log" "connected to next stage" 1 20 ||
                pl_fail "stage $r of $tag did not connect to its next stage"
            pl_wait_log "$PL_WORK/$tag.$r.log" "upstream stage .* connected" 1 20 ||
                pl_fail "stage $r of $tag has no upstream connection"
        fi
    done
}

# pl_stop_pipeline TAG S: SIGTERM to every stage; each must exit (status 0) within 5 s,
# else it is killed and the test fails.
pl_stop_pipeline() {
    local tag=$1 S=$2 r pid i rc
    for ((r = 0; r < S; r++)); do
        kill "$(pl_pid "$tag" "$r")" 2>/dev/null
    done
    for ((r = 0; r < S; r++)); do
        pid=$(pl_pid "$tag" "$r")
        for ((i = 0; i < 100; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        if kill -0 "$pid" 2>/dev/null; then
            kill -9 "$pid" 2>/dev/null
            pl_fail "stage $r of $tag did not exit within 5 s of SIGTERM"
        fi
        wait "$pid"
        rc=$?
        [ "$rc" -eq 0 ] || pl_fail "stage $r of $tag exited with status $rc after SIGTERM"
    done
}

# pl_client TAG [strata-client options...] (security chosen as by pl_start_stage)
pl_client() {
    local tag=$1
    shift
    # shellcheck disable=SC2046
    "$PL_CLIENT" --port-file "$PL_WORK/$tag.0.port" --timeout-ms 20000 $(pl_security_default "$@") "$@"
}

# pl_start_vision TAG MODEL_DIR [options...]: a vision stage (strata-stage --role vision) in
# front of TAG's stage 0 (port file TAG.v.port; security as pl_start_stage); waits until it
# listens. pl_stop_vision: SIGTERM, status 0 expected. pl_vclient TAG [options]: its client.
# STRATA_TEST_VISION_DEVICE=cuda:N (bazel test --test_env=...) runs the tower on that GPU
# (tools/cuda_first_run.sh does, on a device machine).
pl_start_vision() {
    local tag=$1 model=$2
    shift 2
    rm -f "$PL_WORK/$tag.v.port" "$PL_WORK/$tag.v.log"
    # shellcheck disable=SC2046
    "$PL_STAGE" --role vision --model "$model" --port-file "$PL_WORK/$tag.v.port" \
        --next-port-file "$PL_WORK/$tag.0.port" $(pl_security_default "$@") \
        ${STRATA_TEST_VISION_DEVICE:+--device "$STRATA_TEST_VISION_DEVICE"} "$@" \
        >>"$PL_WORK/$tag.v.out" 2>>"$PL_WORK/$tag.v.log" &
    PL_VISION_PID=$!
    PL_PIDS="$PL_PIDS $PL_VISION_PID"
    pl_wait_log "$PL_WORK/$tag.v.log" "listening on" 1 20 || pl_fail "the vision stage of $tag did not start"
}
pl_stop_vision() {
    local rc
    kill "$PL_VISION_PID" 2>/dev/null
    wait "$PL_VISION_PID"
    rc=$?
    [ "$rc" -eq 0 ] || pl_fail "the vision stage exited with status $rc after SIGTERM"
}
pl_vclient() {
    local tag=$1
    shift
    # shellcheck disable=SC2046
    "$PL_CLIENT" --port-file "$PL_WORK/$tag.v.port" --timeout-ms 20000 $(pl_security_default "$@") "$@"
}

# pl_wait_file FILE TIMEOUT_S
pl_wait_file() {
    local i=0
    while [ "$i" -lt $(($2 * 20)) ]; do
        [ -s "$1" ] && return 0
        sleep 0.05
        i=$((i + 1))
    done
    return 1
}

# pl_secs_between START END -> END - START in seconds (3 decimals)
pl_secs_between() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

# "request 0: tokens 1 2 3" -> "1,2,3"
pl_tokens_of() { sed -n "s/^request $2: tokens //p" "$1" | tr ' ' ','; }
