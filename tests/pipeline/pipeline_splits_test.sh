#!/usr/bin/env bash
# Integration: 1, 2, 3 and 4 strata-stage processes on loopback give the same tokens (equal
# to the golden ones) and byte-identical --out files (tokens + every step's logits) for
# each golden model. Prefill runs in chunks of 8 so long prompts cross stages chunk by chunk.
# Then --split decode (stage_plan_decode's ranges, which differ from the even split on these
# two cases) gives the same tokens and bytes.
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
for spec in qwen3_long_prompt:2:3 qwen3_moe:3:2; do
    IFS=: read -r case S last_start <<<"$spec"
    case " $cases " in *" $case "*) ;; *) continue ;; esac
    model=$(pl_golden "$case")
    tag="${case}_decode$S"
    out="$PL_WORK/$tag.safetensors"
    pl_start_pipeline "$tag" "$S" "$model" --max-seq 256 --max-batch 4 --chunk-size 8 \
        --split decode --out "$out"
    grep -q "shard: layers \[$last_start, " "$PL_WORK/$tag.$((S - 1)).out" ||
        pl_fail "$case --split decode: last stage does not start at layer $last_start: $(cat "$PL_WORK/$tag.$((S - 1)).out")"
    pl_client "$tag" --prompt "$(pl_golden_prompt "$case")" --max-tokens "$(pl_golden_steps "$case")" \
        >"$PL_WORK/$tag.client" || pl_fail "$case --split decode: client failed"
    got=$(pl_tokens_of "$PL_WORK/$tag.client" 0)
    [ "$got" = "$(pl_golden_generated "$case")" ] || pl_fail "$case --split decode: tokens $got"
    pl_wait_file "$out" 5 || pl_fail "$case --split decode: no --out file"
    cmp -s "$out" "$PL_WORK/${case}_1.safetensors" ||
        pl_fail "$case --split decode: tokens/logits differ from the single stage"
    pl_stop_pipeline "$tag" "$S"
    echo "$case: $S stages, --split decode (last stage from layer $last_start): identical to single-stage: yes"
done
echo "PASS"
