#!/usr/bin/env bash
# Integration, deployment with existing tools: deploy/slurm/strata.sbatch runs a
# 4-task pipeline (one strata-stage per Slurm task, TLS 1.3 PSK links) on a single-node Slurm
# that the test starts itself (tests/deploy/slurm_lib.sh: munged, slurmctld, slurmd with one
# node declaring 4 CPUs, all in a temporary directory, random free ports). The job's one-shot
# client must print the golden tokens, and the last stage's --out (tokens + logits) must be
# byte-identical to a single-stage run's. Skipped with the reason where it cannot run: not
# root, no Slurm/munge binaries, or daemons that do not come up within 20 s.
# Then the grid: an 8-task job with --tp 2 --kvp 2 --kvp-tokens 32 (PP 2 x TP 2 x
# KVP 2, one task per rank, the 48-token sequence spanning both KVP ranks): golden tokens,
# every task in its place (stage, TP rank, KVP rank, group port), only the two leaders on
# the ring.
# (slurm_netns_test runs the same script on 4 namespaced nodes.)
set -u
. "$(dirname "$0")/../pipeline/pipeline_lib.sh"
. "$(dirname "$0")/slurm_lib.sh"
pl_init
trap 'sl_cleanup; pl_cleanup' EXIT
trap 'sl_cleanup; pl_cleanup; exit 1' INT TERM
sl_init

# free_port: a random TCP port that nothing listens on, nor on the 3 ports after it.
free_port() {
    local p i
    for ((i = 0; i < 100; i++)); do
        p=$((20000 + RANDOM % 12000))
        if [ -z "$(ss -Htln "( sport = :$p or sport = :$((p + 1)) or sport = :$((p + 2)) or sport = :$((p + 3)) )")" ]; then
            echo "$p"
            return 0
        fi
    done
    return 1
}
if ! ctld_port=$(free_port) || ! slurmd_port=$(free_port) || ! stage_port=$(free_port); then
    pl_fail "no free ports"
fi
sl_conf 127.0.0.1 "$ctld_port" "$slurmd_port" "NodeName=strata-node NodeAddr=127.0.0.1 CPUs=8"
sl_start_munged
sl_start_slurmctld ""
sl_start_slurmd strata-node
sl_wait_idle ""

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

export STRATA_BIN_DIR="$PL_BIN" STRATA_PORT_BASE="$stage_port" STRATA_READY_TIMEOUT=30
export STRATA_CLIENT_ARGS="--prompt $prompt --max-tokens $steps"
sl_run_job "" --ntasks=4 -- --model "$model" --auth-key-file "$SL_DIR/key" "${opts[@]}" \
    --out "$SL_DIR/out.safetensors"
got=$(pl_tokens_of "$SL_JOB_OUT" 0)
[ "$got" = "$want" ] || sl_fail "tokens from the Slurm job $got, golden $want"
cmp -s "$SL_DIR/out.safetensors" "$PL_WORK/one.safetensors" ||
    sl_fail "the Slurm pipeline's tokens/logits differ from the single stage"
for r in 0 1 2 3; do
    grep -q "^$r: .*listening on 127.0.0.1:$((stage_port + r))" "$SL_JOB_LOG" ||
        sl_fail "task $r did not listen on its ring address"
    grep -q "^$r: .*connected to next stage .*(TLS 1.3, PSK)" "$SL_JOB_LOG" ||
        sl_fail "task $r's link is not TLS 1.3"
done
grep "^  stage\|ring ready\|client exit" "$SL_JOB_OUT"
echo "slurm job: 4 tasks (srun), tokens golden, --out identical to the single stage, stages" \
    "stopped with status 0; $SL_JOB_SECS s from sbatch to COMPLETED"

# PP 2 x TP 2 x KVP 2 = 8 tasks: task r = stage r / 4, group rank g = r mod 4 (TP rank g mod 2,
# KVP rank g / 2); leaders 0 and 4 on the ring at base + r, every group at base + 8 + r.
sl_run_job "" --ntasks=8 -- --model "$model" --auth-key-file "$SL_DIR/key" --max-seq 64 \
    --max-batch 4 --chunk-size 8 --tp 2 --kvp 2 --kvp-tokens 32
got=$(pl_tokens_of "$SL_JOB_OUT" 0)
[ "$got" = "$want" ] || sl_fail "grid job: tokens $got, golden $want"
grep -q "PP 2 x TP 2 x KVP 2 = 8 tasks" "$SL_JOB_OUT" || sl_fail "grid job: no grid table"
for r in 0 1 2 3 4 5 6 7; do
    s=$((r / 4)) g=$((r % 4))
    grep -q "^  task $r: stage $s, tp rank $((g % 2)), kvp rank $((g / 2)) on strata-node, group at 127.0.0.1:$((stage_port + 8 + r))" \
        "$SL_JOB_OUT" || sl_fail "grid job: task $r is not placed as stage $s, group rank $g"
    grep -q "^$r: .*group \"s$s\.L[0-9]*-[0-9]*\.tp2\.kvp2x32\.expert\": rank $g of 4 connected" "$SL_JOB_LOG" ||
        sl_fail "grid job: task $r did not join stage $s's group as rank $g"
    if [ "$g" = 0 ]; then
        grep -q "^$r: .*listening on 127.0.0.1:$((stage_port + r))" "$SL_JOB_LOG" ||
            sl_fail "grid job: leader task $r does not listen at base + $r"
    elif grep -q "^$r: .*listening on" "$SL_JOB_LOG"; then
        sl_fail "grid job: follower task $r listens for stage links"
    fi
done
grep -q "^4: .*connected to next stage 0 at 127.0.0.1:$stage_port (TLS 1.3, PSK)" "$SL_JOB_LOG" ||
    sl_fail "grid job: stage 1's leader did not link to stage 0's"
echo "slurm grid job: PP 2 x TP 2 x KVP 2 in 8 tasks, each in its place, tokens golden;" \
    "$SL_JOB_SECS s from sbatch to COMPLETED"
echo "PASS"
