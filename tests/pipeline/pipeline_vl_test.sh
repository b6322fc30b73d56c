#!/usr/bin/env bash
# Integration: Qwen3-VL requests through real strata-stage processes on loopback. For each
# VL golden (tests/golden/qwen3_vl, qwen3_vl_moe) strata-client sends the golden prompt with
# its image grid, the recorded vision embeddings and DeepStack features (--grid,
# --vision-embeds, --deepstack). One stage, three stages on the even split and three stages
# cut between the DeepStack layers ([0,1) [1,2) [2,4)) give the golden ids and byte-identical
# --out files (tokens + every step's logits). The prompt goes once with one image pad
# (stage 0 expands it) and once expanded; prefill chunks of 4 cut through the image rows.
# A malformed request (grid not matching the prompt) gets a clear error and the pipeline
# keeps serving.
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init

# "1,500,500,2" -> "1,500,2": each run of image pads collapsed to one.
collapse() { echo "$1" | tr ',' '\n' | awk -v img="$2" '$1 != img || prev != img { out = out (out == "" ? "" : ",") $1 } { prev = $1 } END { print out }'; }

for case in qwen3_vl qwen3_vl_moe; do
    model=$(pl_golden "$case")
    prompt=$(pl_golden_prompt "$case")
    want=$(pl_golden_generated "$case")
    steps=$(pl_golden_steps "$case")
    short=$(collapse "$prompt" 500)
    vision=(--grid 1,4,6 --vision-embeds "$model/vision_embeds.f32" --deepstack "$model/deepstack.f32")
    for split in 1 3 3cut; do
        tag="${case}_$split"
        out="$PL_WORK/$tag.safetensors"
        opts=(--max-seq 64 --max-batch 2 --chunk-size 4 --out "$out")
        case $split in
        1) pl_start_pipeline "$tag" 1 "$model" "${opts[@]}" ;;
        3) pl_start_pipeline "$tag" 3 "$model" "${opts[@]}" ;;
        3cut)
            bounds=(0 1 2 4)
            for r in 0 1 2; do
                pl_start_stage "$tag" 3 "$r" "$model" "${opts[@]}" \
                    --layer-start "${bounds[$r]}" --layer-end "${bounds[$((r + 1))]}"
            done
            pl_wait_ready "$tag" 3
            ;;
        esac
        S=${split%cut}
        p=$short
        [ "$split" = 3 ] && p=$prompt
        pl_client "$tag" --prompt "$p" --max-tokens "$steps" "${vision[@]}" >"$PL_WORK/$tag.client" ||
            pl_fail "$case on $split: client failed: $(cat "$PL_WORK/$tag.client")"
        got=$(pl_tokens_of "$PL_WORK/$tag.client" 0)
        [ "$got" = "$want" ] || pl_fail "$case on $split: tokens $got, golden $want"
        pl_wait_file "$out" 5 || pl_fail "$case on $split: no --out file"
        if [ "$split" != 1 ]; then
            cmp -s "$out" "$PL_WORK/${case}_1.safetensors" ||
                pl_fail "$case on $split: tokens/logits differ from the single stage"
        fi
        if [ "$split" = 3cut ]; then
            # A grid that does not match the prompt's image pads: a clear error, exit 1.
            pl_client "$tag" --prompt "$short" --max-tokens 2 --grid 1,4,8 \
                --vision-embeds "$model/vision_embeds.f32" >"$PL_WORK/$tag.bad" 2>&1 &&
                pl_fail "$case: a mismatched grid was accepted"
            grep -q "vision_embeds must be F32 \[image tokens, H\]" "$PL_WORK/$tag.bad" ||
                grep -q "not f32 values in rows of 8" "$PL_WORK/$tag.bad" ||
                pl_fail "$case: unclear error for a mismatched grid: $(cat "$PL_WORK/$tag.bad")"
            pl_client "$tag" --prompt "$prompt" --max-tokens 2 --grid 1,4,4 --grid 1,4,8 \
                --vision-embeds "$model/vision_embeds.f32" >"$PL_WORK/$tag.bad2" 2>&1 &&
                pl_fail "$case: two grids for one image were accepted"
            grep -q "holds 6 image tokens (id 500) for 2 image(s)" "$PL_WORK/$tag.bad2" ||
                pl_fail "$case: unclear error for two grids: $(cat "$PL_WORK/$tag.bad2")"
            echo "$case: refused: $(grep -o 'stage 0: bad request.*' "$PL_WORK/$tag.bad2")"
            pl_client "$tag" --prompt "$short" --max-tokens "$steps" "${vision[@]}" \
                >"$PL_WORK/$tag.again" || pl_fail "$case: the pipeline stopped serving"
            [ "$(pl_tokens_of "$PL_WORK/$tag.again" 0)" = "$want" ] ||
                pl_fail "$case: tokens after the refusals differ"
        fi
        pl_stop_pipeline "$tag" "$S"
        echo "$case: $split stage(s): tokens match golden, identical to single-stage: yes"
    done
done
# The two-image end-to-end goldens (tests/golden/<case>/e2e, when in the checkout): the
# prompt with one pad per image and both grids on 3 stages cut between the DeepStack layers.
e2e_list() { sed -n "/\"$1\": \[/,/\]/p" "$2" | tr -d ' \n' | grep -o '\[[0-9,]*\]' | tr -d '[]'; }
for case in qwen3_vl qwen3_vl_moe; do
    model=$(pl_golden "$case")
    e2e="$model/e2e"
    if [ ! -f "$e2e/e2e.json" ]; then
        echo "$case: skipped the two-image e2e run: $e2e not in this checkout"
        continue
    fi
    grids=()
    for g in $(e2e_list grid_thw "$e2e/e2e.json"); do grids+=(--grid "$g"); done
    want=$(e2e_list generated_ids "$e2e/e2e.json")
    tag="${case}_e2e"
    bounds=(0 1 2 4)
    for r in 0 1 2; do
        pl_start_stage "$tag" 3 "$r" "$model" --max-seq 128 --max-batch 2 --chunk-size 8 \
            --layer-start "${bounds[$r]}" --layer-end "${bounds[$((r + 1))]}"
    done
    pl_wait_ready "$tag" 3
    pl_client "$tag" --prompt "$(e2e_list prompt_ids "$e2e/e2e.json")" \
        --max-tokens "$(echo "$want" | tr ',' '\n' | wc -l)" "${grids[@]}" \
        --vision-embeds "$e2e/vision_embeds.f32" --deepstack "$e2e/deepstack.f32" \
        >"$PL_WORK/$tag.client" || pl_fail "$case e2e: client failed: $(cat "$PL_WORK/$tag.client")"
    got=$(pl_tokens_of "$PL_WORK/$tag.client" 0)
    [ "$got" = "$want" ] || pl_fail "$case e2e: tokens $got, golden $want"
    pl_stop_pipeline "$tag" 3
    echo "$case e2e: $((${#grids[@]} / 2)) images, 3 stages: tokens match golden: yes"
done
echo "PASS"
