#!/usr/bin/env bash
# Links soak (not a test: it runs for an hour by default): two 3-stage loopback rings, one on
# TLS 1.3 with a pre-shared key and one with certificates, kept up for SOAK_SECONDS while
#   - every SOAK_EVERY_S (60) a new client connects to each ring and must get the golden
#     tokens (new handshakes against contexts made at start-up: OpenSSL once aged the PSK
#     session out after 304 s, and every new connection failed from then on);
#   - every SOAK_CHURN_EVERY_S (600) one stage of each ring, in turn 1, 2, 0, is stopped
#     (SIGTERM) and started again, and must rejoin; then stage 1 or 2 (in turn) is killed
#     (SIGKILL) mid-request and started again, and the request in flight must recover with the tokens
#     of an undisturbed run (a restarted stage makes new handshakes with neighbours as old as
#     the soak).
# Prints a line per check with the ring's uptime, and at the end
# "soak: N checks over S s, F failed"; exits 1 when any check failed.
# Env: SOAK_SECONDS (3600), SOAK_EVERY_S (60), SOAK_CHURN_EVERY_S (600), STRATA_BIN_DIR.
set -u
case "${1:-}" in -h | --help)
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
esac
cd "$(dirname "$0")/.."
# STRATA_BIN_DIR: binaries built before (runtime/strata-stage, runtime/strata-client,
# tests/wire/make_test_pki), e.g. a copy, so that rebuilding during the hour does not change
# what a restarted stage runs; without it they are built here.
if [ -z "${STRATA_BIN_DIR:-}" ]; then
    targets=(//runtime:strata-stage //runtime:strata-client //tests/wire:make_test_pki)
    bazel build ${STRATA_BAZEL_FLAGS:-} "${targets[@]}" >/dev/null 2>&1 ||
        { bazel build ${STRATA_BAZEL_FLAGS:-} "${targets[@]}"; exit 1; }
    STRATA_BIN_DIR="$(bazel info ${STRATA_BAZEL_FLAGS:-} bazel-bin 2>/dev/null)"
fi
export STRATA_BIN_DIR
. tests/pipeline/pipeline_lib.sh
pl_init

SECONDS_TOTAL=${SOAK_SECONDS:-3600}
EVERY=${SOAK_EVERY_S:-60}
CHURN=${SOAK_CHURN_EVERY_S:-600}
case=qwen3_gqa_tied
model=$(pl_golden "$case")
prompt=$(pl_golden_prompt "$case")
want=$(pl_golden_generated "$case")
steps=$(pl_golden_steps "$case")
long=300

head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PL_WORK/key"
"$STRATA_BIN_DIR/tests/wire/make_test_pki" "$PL_WORK/pki" >/dev/null || pl_fail "make_test_pki failed"
# The key travels by file (--auth-key-file), so the certificate ring runs without one.
psk=(--auth-key-file "$PL_WORK/key")
cert=(--tls-cert "$PL_WORK/pki/a.crt" --tls-key "$PL_WORK/pki/a.key" --tls-ca "$PL_WORK/pki/ca.crt")
cert_client=(--tls-cert "$PL_WORK/pki/b.crt" --tls-key "$PL_WORK/pki/b.key" --tls-ca "$PL_WORK/pki/ca.crt")
opts=(--max-seq 512 --max-batch 4 --step-delay-ms 2)

ring_opts() { if [ "$1" = psk ]; then echo "${psk[@]}"; else echo "${cert[@]}"; fi; }
client_opts() { if [ "$1" = psk ]; then echo "${psk[@]}"; else echo "${cert_client[@]}"; fi; }

checks=0
failed=0
start=$(date +%s)
uptime_s() { echo $(($(date +%s) - start)); }
report() { # RING WHAT OK DETAIL
    checks=$((checks + 1))
    if [ "$3" = 1 ]; then
        echo "[$(printf '%5d' "$(uptime_s)") s] $1: $2: ok${4:+ ($4)}"
    else
        failed=$((failed + 1))
        echo "[$(printf '%5d' "$(uptime_s)") s] $1: $2: FAILED: $4"
    fi
}

# shellcheck disable=SC2046
for ring in psk cert; do
    pl_start_pipeline "$ring" 3 "$model" "${opts[@]}" $(ring_opts "$ring")
done
for ring in psk cert; do
    # shellcheck disable=SC2046
    pl_client "$ring" $(client_opts "$ring") --prompt "$prompt" --max-tokens "$long" \
        >"$PL_WORK/$ring.long" 2>&1 || pl_fail "$ring: the reference request failed"
done

new_client() { # RING
    local out="$PL_WORK/$1.req"
    # shellcheck disable=SC2046
    if pl_client "$1" $(client_opts "$1") --prompt "$prompt" --max-tokens "$steps" >"$out" 2>&1 &&
        [ "$(pl_tokens_of "$out" 0)" = "$want" ]; then
        report "$1" "new client" 1
    else
        report "$1" "new client" 0 "$(tail -n 1 "$out")"
    fi
}

restart_stage() { # RING R: SIGTERM, start again, wait for the ring to re-form
    local ring=$1 r=$2 n0 nup
    n0=$(grep -c "connected to next stage" "$PL_WORK/$ring.$(((r + 2) % 3)).log")
    nup=$(grep -c "upstream stage .* connected" "$PL_WORK/$ring.$(((r + 1) % 3)).log")
    kill -TERM "$(pl_pid "$ring" "$r")"
    wait "$(pl_pid "$ring" "$r")" 2>/dev/null
    : >"$PL_WORK/$ring.$r.log"
    # shellcheck disable=SC2046
    pl_start_stage "$ring" 3 "$r" "$model" "${opts[@]}" $(ring_opts "$ring")
    if pl_wait_log "$PL_WORK/$ring.$(((r + 2) % 3)).log" "connected to next stage" $((n0 + 1)) 30 &&
        pl_wait_log "$PL_WORK/$ring.$(((r + 1) % 3)).log" "upstream stage .* connected" $((nup + 1)) 30 &&
        pl_wait_log "$PL_WORK/$ring.$r.log" "connected to next stage" 1 30; then
        report "$ring" "stage $r stopped and restarted, ring re-formed" 1
    else
        report "$ring" "stage $r stopped and restarted" 0 "the ring did not re-form within 30 s"
    fi
}

recover_stage() { # RING R: SIGKILL mid-request, start again, the request must recover
    local ring=$1 r=$2 client out="$PL_WORK/$1.victim"
    # shellcheck disable=SC2046
    pl_client "$ring" $(client_opts "$ring") --prompt "$prompt" --max-tokens "$long" >"$out" 2>&1 &
    client=$!
    sleep 0.3
    pl_kill_stage "$ring" "$r"
    : >"$PL_WORK/$ring.$r.log"
    # shellcheck disable=SC2046
    pl_start_stage "$ring" 3 "$r" "$model" "${opts[@]}" $(ring_opts "$ring")
    if wait "$client" && [ "$(pl_tokens_of "$out" 0)" = "$(pl_tokens_of "$PL_WORK/$ring.long" 0)" ]; then
        report "$ring" "stage $r killed mid-request and restarted, request recovered" 1
    else
        report "$ring" "stage $r killed mid-request" 0 "$(tail -n 1 "$out")"
    fi
    pl_wait_log "$PL_WORK/$ring.$r.log" "connected to next stage" 1 30 || true
}

echo "soak: 2 rings (PSK, certificates) x 3 stages for $SECONDS_TOTAL s; a new client every $EVERY s, a restart and a recovery every $CHURN s"
next_check=0
next_churn=$CHURN
turn=0
while [ "$(uptime_s)" -lt "$SECONDS_TOTAL" ]; do
    now=$(uptime_s)
    if [ "$now" -ge "$next_check" ]; then
        new_client psk
        new_client cert
        next_check=$((next_check + EVERY))
    fi
    if [ "$now" -ge "$next_churn" ]; then
        r=$(((turn + 1) % 3))
        for ring in psk cert; do
            restart_stage "$ring" "$r"
            recover_stage "$ring" $((turn % 2 + 1))
            new_client "$ring"
        done
        turn=$((turn + 1))
        next_churn=$((next_churn + CHURN))
    fi
    sleep 1
done
for ring in psk cert; do
    new_client "$ring"
done
echo "soak: $checks checks over $(uptime_s) s, $failed failed"
[ "$failed" -eq 0 ]
