#!/usr/bin/env bash
# Integration, tests across hosts: a 4-stage pipeline across 4 hosts (network
# namespaces on a bridge, see netns_lib.sh), the client on a fifth, gives each golden case's
# tokens, and its --out file (tokens + every step's logits) is byte-identical to a
# single-stage run's on loopback. Every link runs TLS 1.3 with this run's key. Skipped with
# the reason where namespaces cannot be made (not root, no iproute2, a read-only /run/netns).
set -u
. "$(dirname "$0")/netns_lib.sh"
nl_init 4

head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PL_WORK/key"
export STRATA_AUTH_KEY="$(cat "$PL_WORK/key")"
for case in qwen3_deep8 qwen3_moe; do
    model=$(pl_golden "$case")
    prompt=$(pl_golden_prompt "$case")
    want=$(pl_golden_generated "$case")
    steps=$(pl_golden_steps "$case")
    opts=(--max-seq 256 --max-batch 4 --chunk-size 8)

    # The reference: one stage on this machine's loopback.
    pl_start_pipeline "${case}_1" 1 "$model" "${opts[@]}" --out "$PL_WORK/${case}_1.safetensors"
    pl_client "${case}_1" --prompt "$prompt" --max-tokens "$steps" >"$PL_WORK/${case}_1.client" ||
        pl_fail "$case on 1 stage: client failed: $(cat "$PL_WORK/${case}_1.client")"
    pl_wait_file "$PL_WORK/${case}_1.safetensors" 5 || pl_fail "$case on 1 stage: no --out file"
    pl_stop_pipeline "${case}_1" 1

    tag="${case}_hosts"
    out="$PL_WORK/$tag.safetensors"
    tx0=$(nl_tx_packets 1)
    nl_start_pipeline "$tag" 4 "$model" "${opts[@]}" --out "$out"
    grep -q "links: TLS 1.3 with a pre-shared key" "$PL_WORK/$tag.0.log" ||
        pl_fail "$case: the ring does not run on TLS"
    nl_client --prompt "$prompt" --max-tokens "$steps" >"$PL_WORK/$tag.client" ||
        pl_fail "$case on 4 hosts: client failed: $(cat "$PL_WORK/$tag.client")"
    got=$(pl_tokens_of "$PL_WORK/$tag.client" 0)
    [ "$got" = "$want" ] || pl_fail "$case on 4 hosts: tokens $got, golden $want"
    pl_wait_file "$out" 5 || pl_fail "$case on 4 hosts: no --out file"
    cmp -s "$out" "$PL_WORK/${case}_1.safetensors" ||
        pl_fail "$case on 4 hosts: tokens/logits differ from the single stage"
    grep -q "upstream stage 3 connected from $(nl_addr 3):" "$PL_WORK/$tag.0.log" ||
        pl_fail "$case: stage 0's upstream link does not come from host 3's address"
    tx=$(($(nl_tx_packets 1) - tx0))
    pl_stop_pipeline "$tag" 4
    echo "$case: 4 stages on 4 hosts ($(nl_addr 0)..$(nl_addr 3)), client on $NL_CLIENT_ADDR:" \
        "tokens match golden, --out identical to single-stage; host 1 sent $tx packets;" \
        "$(grep '^total:' "$PL_WORK/$tag.client")"
done
echo "PASS"
