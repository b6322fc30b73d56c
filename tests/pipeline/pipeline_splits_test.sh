#!/usr/bin/env bash
# Integration: 1, 2, 3 and 4 strata-stage processes on loopback give the same tokens (equal
# to the golden ones) and byte-identical --out files (tokens + every step's logits) for
# each golden model. Prefill runs in chunks of 8 so long prompts cross stages chunk by chunk.
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init

cases="${PIPELINE_CASES:-qwen3_gqa_tied qwen3_mha_untied qwen3_deep8 qwen3_moe qwen3_moe_nonorm qwen3_long_prompt}"
for case in $cases; do
    model=$(pl_golden "$case")
    prompt=$(pl_golden_prompt "$case")
    want=$(pl_golden_generated "$case")
    steps=$(pl_golden_steps "$case")
    for S in 1 2 3 4; do
        tag="${case}_$S"
        out="$PL_WORK/$tag.safetensors"
        pl_start_pipeline "$tag" "$S" "$model" --max-seq 256 --max-batch 4 --chunk-size 8 \
            --out "$out"
        pl_client "$tag" --prompt "$prompt" --max-tokens "$steps" >"$PL_WORK/$tag.client" ||
            pl_fail "$case on $S stages: client failed: $(cat "$PL_WORK/$tag.client")"
        got=$(pl_tokens_of "$PL_WORK/$tag.client" 0)
        [ "$got" = "$want" ] || pl_fail "$case on $S stages: tokens $got, golden $want"
        pl_wait_file "$out" 5 || pl_fail "$case on $S stages: no --out file"
        if [ "$S" -gt 1 ]; then
            cmp -s "$out" "$PL_WORK/${case}_1.safetensors" ||
                pl_fail "$case on $S stages: tokens/logits differ from the single stage"
        fi
        pl_stop_pipeline "$tag" "$S"
        echo "$case: $S stage(s): tokens match golden, identical to single-stage: yes"
    done
done
echo "PASS"
