#!/usr/bin/env bash
# Integration: TLS 1.3 on every link. A 3-stage ring with a pre-shared key (TLS external PSK)
# and one with certificates from a throwaway CA (mutual authentication) give the golden
# tokens, the same as a plaintext (--insecure) ring, which warns at startup; without a key,
# certificates or --insecure strata-stage and strata-client refuse to start. A stage with a
# wrong key, a stage whose certificate comes from another CA and a client without TLS are
# refused, with a line naming TLS in the logs of both sides. Inconsistent TLS flags are a
# usage error (exit 2).
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init
case=qwen3_gqa_tied
model=$(pl_golden "$case")
prompt=$(pl_golden_prompt "$case")
want=$(pl_golden_generated "$case")
steps=$(pl_golden_steps "$case")
printf 'a-pre-shared-key-of-enough-bytes\n' >"$PL_WORK/key"
printf 'another-key-that-does-not-match!\n' >"$PL_WORK/wrong"
unset STRATA_AUTH_KEY

run_ring() { # run_ring TAG [options for every stage and the client...]
    local tag=$1
    shift
    pl_start_pipeline "$tag" 3 "$model" --max-seq 256 --max-batch 4 "$@"
    pl_client "$tag" --prompt "$prompt" --max-tokens "$steps" "$@" >"$PL_WORK/$tag.client" 2>&1 ||
        pl_fail "$tag: client failed: $(cat "$PL_WORK/$tag.client")"
    got=$(pl_tokens_of "$PL_WORK/$tag.client" 0)
    [ "$got" = "$want" ] || pl_fail "$tag: tokens $got, golden $want"
    pl_stop_pipeline "$tag" 3
}

expect_exit() { # expect_exit CODE PATTERN command...
    local want=$1 pattern=$2 rc
    shift 2
    "$@" >"$PL_WORK/cmd.out" 2>&1
    rc=$?
    [ "$rc" -eq "$want" ] || pl_fail "exit $rc (want $want) from: $* -> $(cat "$PL_WORK/cmd.out")"
    grep -q -- "$pattern" "$PL_WORK/cmd.out" || pl_fail "no '$pattern' in output of $*: $(cat "$PL_WORK/cmd.out")"
}
expect_exit 2 "exclude each other" "$PL_STAGE" --model "$model" --num-stages 1 --insecure \
    --tls-cert x --tls-key y --tls-ca z
expect_exit 2 "need all of --tls-cert, --tls-key and --tls-ca" "$PL_STAGE" --model "$model" \
    --num-stages 1 --tls-cert x
expect_exit 2 "cannot load certificate x" "$PL_STAGE" --model "$model" --num-stages 1 \
    --tls-cert x --tls-key y --tls-ca z
expect_exit 2 "exclude each other" "$PL_CLIENT" --port 1 --prompt 1 --insecure --tls-cert x \
    --tls-key y --tls-ca z
expect_exit 0 "--tls-cert" "$PL_STAGE" --help
# No key, no certificates, no --insecure: refused (plaintext only when asked for).
expect_exit 2 "links need TLS 1.3" "$PL_STAGE" --model "$model" --num-stages 1
expect_exit 2 "links need TLS 1.3" "$PL_CLIENT" --port 1 --prompt 1
echo "flags: no security choice, --insecure with certificates, an incomplete or unreadable certificate set refused"

run_ring plain --insecure
grep -q "warn: --insecure: links are NOT encrypted" "$PL_WORK/plain.0.log" ||
    pl_fail "no --insecure warning: $(cat "$PL_WORK/plain.0.log")"
grep -q "warning: --insecure" "$PL_WORK/plain.client" || pl_fail "client did not warn"
echo "plaintext (--insecure): golden tokens, warned"

run_ring psk --auth-key-file "$PL_WORK/key"
grep -q "links: TLS 1.3 with a pre-shared key" "$PL_WORK/psk.2.log" || pl_fail "stage 2 not on PSK TLS"
grep -q "connected to next stage 0 at .* (TLS 1.3, PSK)" "$PL_WORK/psk.2.log" || pl_fail "stage 2 hop not logged as PSK"
echo "TLS PSK: 3 stages, same tokens as plaintext"

if [ -x "$PL_ROOT/tests/wire/make_test_pki" ]; then
    "$PL_ROOT/tests/wire/make_test_pki" "$PL_WORK/pki" || pl_fail "cannot make the test PKI"
    certs() { echo --tls-cert "$PL_WORK/pki/$1.crt" --tls-key "$PL_WORK/pki/$1.key" --tls-ca "$PL_WORK/pki/$2.crt"; }
    # shellcheck disable=SC2046
    run_ring cert $(certs a ca)
    grep -q "links: TLS 1.3 with certificates" "$PL_WORK/cert.1.log" || pl_fail "stage 1 not on certificate TLS"
    grep -q "upstream stage 0 connected from .* (TLS 1.3, CN=a)" "$PL_WORK/cert.1.log" ||
        pl_fail "stage 1 did not log its upstream's certificate name: $(cat "$PL_WORK/cert.1.log")"
    echo "TLS certificates: 3 stages, same tokens as plaintext"
    # A stage with a certificate of another CA (that trusts ours): refused both ways.
    # shellcheck disable=SC2046
    pl_start_stage rogue 2 0 "$model" $(certs a ca)
    # shellcheck disable=SC2046
    pl_start_stage rogue 2 1 "$model" $(certs rogue ca)
    pl_wait_log "$PL_WORK/rogue.0.log" "refused connection from .*TLS handshake.*peer certificate" 1 10 ||
        pl_fail "stage 0 did not refuse the rogue certificate: $(cat "$PL_WORK/rogue.0.log")"
    pl_wait_log "$PL_WORK/rogue.1.log" "connecting to the next stage.*TLS.*refused this side" 1 10 ||
        pl_fail "the rogue stage did not log its refusal: $(cat "$PL_WORK/rogue.1.log")"
    pl_stop_pipeline rogue 2
    echo "certificate of another CA: refused, logged on both sides"
fi

# A stage with the wrong key: both stages log a TLS refusal.
pl_start_stage bad 2 0 "$model" --auth-key-file "$PL_WORK/key"
pl_start_stage bad 2 1 "$model" --auth-key-file "$PL_WORK/wrong"
for r in 0 1; do
    pl_wait_log "$PL_WORK/bad.$r.log" "refused connection from .*TLS handshake.*wrong pre-shared key" 1 10 ||
        pl_fail "stage $r did not log the refused handshake: $(cat "$PL_WORK/bad.$r.log")"
    pl_wait_log "$PL_WORK/bad.$r.log" "connecting to the next stage.*TLS handshake" 1 10 ||
        pl_fail "stage $r did not log its own failed handshake: $(cat "$PL_WORK/bad.$r.log")"
done
# A plaintext client at a TLS stage: refused, with the reason on both sides.
"$PL_CLIENT" --port-file "$PL_WORK/bad.0.port" --insecure --prompt "$prompt" --max-tokens 2 \
    --timeout-ms 5000 >"$PL_WORK/bad.client" 2>&1 && pl_fail "a plaintext client was served"
pl_wait_log "$PL_WORK/bad.0.log" "refused connection from .*TLS handshake with client" 2 10 ||
    pl_fail "stage 0 did not log the plaintext client"
pl_stop_pipeline bad 2
echo "wrong key: refused ($(grep -m1 -o 'refused connection.*' "$PL_WORK/bad.0.log"))"
echo "plaintext client: refused ($(tail -n1 "$PL_WORK/bad.client"))"
echo "PASS"
