#!/usr/bin/env bash
# Integration, deployment with existing tools: deploy/slurm/strata.sbatch on a
# 4-node Slurm cluster whose nodes are hosts of their own: one slurmd per network namespace
# (tests/pipeline/netns_lib.sh, NodeAddr 10.77.0.10-13), slurmctld on the fifth (10.77.0.100),
# one munged for the machine (tests/deploy/slurm_lib.sh). Two jobs, each a one-shot 4-stage
# pipeline with TLS 1.3 PSK links: 4 nodes x 1 task, and 2 nodes x 2 tasks
# (SLURM_TASKS_PER_NODE=2(x2): two stages per node on ports base+r). Each must map every task
# to its node's address, give the golden tokens, and write an --out (tokens + logits)
# byte-identical to a single-stage run's. Skipped with the reason without root, network
# namespaces or the Slurm/munge binaries.
set -u
. "$(dirname "$0")/../pipeline/netns_lib.sh"
. "$(dirname "$0")/slurm_lib.sh"
nl_init 4
trap 'sl_cleanup; nl_cleanup' EXIT
trap 'sl_cleanup; nl_cleanup; exit 1' INT TERM
sl_init

nodes=()
for r in 0 1 2 3; do nodes+=("NodeName=node$r NodeAddr=$(nl_addr "$r") CPUs=2"); done
sl_conf "$NL_CLIENT_ADDR" 6817 6818 "${nodes[@]}"
sl_start_munged
sl_start_slurmctld "$NL_CLIENT"
for r in 0 1 2 3; do sl_start_slurmd "node$r" "$(nl_host_ns "$r")"; done
sl_wait_idle "$NL_CLIENT"

case=qwen3_deep8
model=$(pl_golden "$case")
prompt=$(pl_golden_prompt "$case")
want=$(pl_golden_generated "$case")
steps=$(pl_golden_steps "$case")
opts=(--max-seq 256 --max-batch 4 --chunk-size 8)
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$SL_DIR/key"
chmod 600 "$SL_DIR/key"

pl_start_pipeline one 1 "$model" "${opts[@]}" --out "$PL_WORK/one.safetensors"
pl_client one --prompt "$prompt" --max-tokens "$steps" >"$PL_WORK/one.client" ||
    pl_fail "single stage: client failed: $(cat "$PL_WORK/one.client")"
pl_wait_file "$PL_WORK/one.safetensors" 5 || pl_fail "single stage: no --out file"
pl_stop_pipeline one 1

export STRATA_BIN_DIR="$PL_BIN" STRATA_PORT_BASE=7100 STRATA_READY_TIMEOUT=30
export STRATA_CLIENT_ARGS="--prompt $prompt --max-tokens $steps"
for layout in 4 2; do
    rm -f "$SL_DIR/out.safetensors"
    sl_run_job "$NL_CLIENT" --nodes="$layout" --ntasks=4 -- --model "$model" \
        --auth-key-file "$SL_DIR/key" "${opts[@]}" --out "$SL_DIR/out.safetensors"
    got=$(pl_tokens_of "$SL_JOB_OUT" 0)
    [ "$got" = "$want" ] || sl_fail "$layout nodes: tokens $got, golden $want"
    cmp -s "$SL_DIR/out.safetensors" "$PL_WORK/one.safetensors" ||
        sl_fail "$layout nodes: tokens/logits differ from the single stage"
    per=$((4 / layout))
    for r in 0 1 2 3; do
        node=$((r / per))
        next=$((((r + 1) % 4) / per))
        grep -q "^  stage $r on node$node at $(nl_addr "$node"):$((7100 + r))\$" "$SL_JOB_OUT" ||
            sl_fail "$layout nodes: task $r is not mapped to node$node"
        grep -q "^$r: .*listening on $(nl_addr "$node"):$((7100 + r))" "$SL_JOB_LOG" ||
            sl_fail "$layout nodes: task $r does not listen on node$node's address"
        grep -q "^$r: .*connected to next stage $(((r + 1) % 4)) at $(nl_addr "$next"):$((7100 + (r + 1) % 4)) (TLS 1.3, PSK)" \
            "$SL_JOB_LOG" || sl_fail "$layout nodes: task $r did not reach its next stage on node$next"
    done
    echo "slurm job on $layout nodes x $per tasks: $(grep -c '^  stage' "$SL_JOB_OUT") stages at" \
        "$(sed -n 's/^  stage [0-9] on \(node[0-9]\) at \(.*\)$/\1=\2/p' "$SL_JOB_OUT" | tr '\n' ' ')" \
        "tokens golden, --out identical to the single stage; $SL_JOB_SECS s from sbatch to COMPLETED"
done
echo "PASS"
