#!/usr/bin/env bash
# Integration: video through the vision stage (strata-stage --role vision) in front of real
# language stages on loopback, driven by strata-client --video (and --image) with the committed
# video goldens (tests/golden/<case>/video, tools/golden/vl_video_golden.py: an H.264 MP4 alone;
# an image then a VP9 WebM labelled "Video 1: "). The vision stage decodes and samples the
# frames, writes the timestamps into the prompt with the golden's tokenizer (--tokenizer) and
# encodes every frame block. For both cases, one stage and every split tried (2, 3 and 4
# stages) give transformers' greedy ids, logits within 1e-2 of video/logits.f32, and --out files
# byte-identical to one stage's; the link to stage 0 cut after each transfer block resumes to
# the same bytes; two different videos with the same prompt ids (H.264 and HEVC of one clip)
# answer differently, and the second after the first equals the second on fresh stages (the
# prefix cache tells them apart by their embeddings). Hostile videos (truncated, corrupt frames, an AVI, a video for an image token, a file
# over --max-video-bytes, more frames than --max-video-frames) and a vision stage without a
# tokenizer are refused with a clear error, and the stages keep serving.
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init
LOGITS_DIFF="$PL_ROOT/tests/pipeline/logits_diff"
[ -x "$LOGITS_DIFF" ] || pl_fail "logits_diff not found at $LOGITS_DIFF"

vj_list() { tr -d '\n ' <"$2" | sed "s/.*\"$1\":\[\([0-9,-]*\)\].*/\1/"; }
vj_files() { tr -d '\n ' <"$2" | grep -o "\"$1\":\[[^]]*\]" | grep -o '"file":"[^"]*"' | sed 's/"file":"\(.*\)"/\1/'; }

"$PL_STAGE" --role vision --help | grep -q -- "--max-video-bytes" || pl_fail "--role vision --help lacks --max-video-bytes"
"$PL_CLIENT" --help | grep -q -- "--video FILE" || pl_fail "strata-client --help lacks --video"

for case in qwen3_vl qwen3_vl_moe; do
    model=$(pl_golden "$case")
    vd="$model/video"
    vj="$vd/video.json"
    prompt=$(vj_list prompt_ids "$vj")
    want=$(vj_list generated_ids "$vj")
    steps=$(echo "$want" | tr ',' '\n' | wc -l)
    files=()
    for f in $(vj_files images "$vj"); do files+=(--image "$vd/$f"); done
    for f in $(vj_files videos "$vj"); do files+=(--video "$vd/$f"); done
    # every way to cut the 4 layers into 1, 2, 3 or 4 stages that the tests name
    for split in 0,4 0,2,4 0,1,4 0,3,4 0,1,2,4 0,1,2,3,4; do
        IFS=, read -r -a bounds <<<"$split"
        S=$((${#bounds[@]} - 1))
        tag="${case}_$S${split//,/}"
        out="$PL_WORK/$tag.safetensors"
        for ((r = 0; r < S; r++)); do
            pl_start_stage "$tag" "$S" "$r" "$model" --max-seq 192 --max-batch 4 --chunk-size 16 \
                --layer-start "${bounds[$r]}" --layer-end "${bounds[$((r + 1))]}" --out "$out"
        done
        pl_wait_ready "$tag" "$S"
        pl_start_vision "$tag" "$model" --tokenizer "$vd" --vision-block-tokens 16
        grep -q "timestamps tokenized with the model's tokenizer" "$PL_WORK/$tag.v.out" ||
            pl_fail "$case: the vision stage's summary does not say how it writes timestamps"
        pl_vclient "$tag" --prompt "$prompt" --max-tokens "$steps" "${files[@]}" >"$PL_WORK/$tag.client" ||
            pl_fail "$case [$split]: client failed: $(cat "$PL_WORK/$tag.client")"
        got=$(pl_tokens_of "$PL_WORK/$tag.client" 0)
        [ "$got" = "$want" ] || pl_fail "$case [$split]: tokens $got, golden $want"
        pl_wait_file "$out" 5 || pl_fail "$case [$split]: no --out file"
        diff_line=$("$LOGITS_DIFF" "$out" "$vd/logits.f32" 1e-2) || pl_fail "$case [$split]: $diff_line"
        if [ "$split" = 0,4 ]; then
            cp "$out" "$PL_WORK/$case.one.st"
        else
            cmp -s "$PL_WORK/$case.one.st" "$out" || pl_fail "$case [$split]: --out differs from one stage's"
        fi
        echo "$case, vision stage + stages [$split], ${files[*]##*/}: tokens match transformers; $diff_line;" \
            "--out byte-identical to one stage's: yes"
        if [ "$split" = 0,2,4 ]; then # the link to stage 0 cut after each block resumes
            blocks=$(sed -n 's/.*tokens in \([0-9]*\) blocks sent to stage 0.*/\1/p' "$PL_WORK/$tag.v.log" | head -1)
            [ "${blocks:-0}" -ge 2 ] || pl_fail "$case: expected several transfer blocks, got '$blocks'"
            for ((k = 0; k < blocks; k++)); do
                pl_stop_vision
                pl_start_vision "$tag" "$model" --tokenizer "$vd" --vision-block-tokens 16 \
                    --test-drop-after-block "$k"
                rm -f "$out"
                pl_vclient "$tag" --prompt "$prompt" --max-tokens "$steps" "${files[@]}" \
                    >"$PL_WORK/$tag.cut$k" || pl_fail "$case: cut after block $k: $(cat "$PL_WORK/$tag.cut$k")"
                [ "$(pl_tokens_of "$PL_WORK/$tag.cut$k" 0)" = "$want" ] || pl_fail "$case: cut after block $k: tokens differ"
                grep -q "resuming transfers" "$PL_WORK/$tag.v.log" || pl_fail "$case: cut after block $k: no resume logged"
                pl_wait_file "$out" 5 || pl_fail "$case: cut after block $k: no --out"
                cmp -s "$out" "$PL_WORK/$case.one.st" || pl_fail "$case: cut after block $k: --out differs"
            done
            echo "$case: link to stage 0 cut after each of $blocks blocks: resumed, byte-identical --out: yes"
        fi
        if [ "$case" = qwen3_vl ] && [ "$split" = 0,1,2,4 ]; then
            h="$PL_WORK/hostile"
            mkdir -p "$h"
            head -c 20000 "$vd/clip0.mp4" >"$h/truncated.mp4"
            python3 - "$vd/clip0.mp4" "$h/corrupt.mp4" <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
for i in range(len(b) // 3, len(b) - 64, 7):
    b[i] ^= 0x5A
open(sys.argv[2], "wb").write(b)
PY
            printf 'RIFF\000\000\000\000AVI LIST' >"$h/clip.avi"
            refused() { # what, pattern, client args...
                local what=$1 pat=$2
                shift 2
                pl_vclient "$tag" --max-tokens 2 "$@" >"$h/out" 2>&1 && pl_fail "$what: accepted"
                grep -q "$pat" "$h/out" || pl_fail "$what: unclear refusal: $(cat "$h/out")"
                echo "$what: refused: $(grep -o "$pat.*" "$h/out" | head -1 | cut -c1-150)"
            }
            refused "truncated MP4" "video 1 of 1" --prompt 1,502,501,503 --video "$h/truncated.mp4"
            refused "corrupt MP4 frames" "video 1 of 1" --prompt 1,502,501,503 --video "$h/corrupt.mp4"
            refused "an AVI file" "not a readable MP4" --prompt 1,502,501,503 --video "$h/clip.avi"
            refused "a video for an image token" "is a video but" --prompt 1,502,500,503 \
                --video "$vd/clip0.mp4"
            refused "two videos for one token" "fewer image and video tokens" \
                --prompt 1,502,501,503 --video "$vd/clip0.mp4" --video "$vd/clip0.mp4"
            pl_stop_vision
            pl_start_vision "$tag" "$model" --tokenizer "$vd" --max-video-bytes 20000 --max-video-frames 30
            refused "a video over --max-video-bytes" "max-video-bytes" --prompt 1,502,501,503 \
                --video "$vd/clip0.mp4"
            pl_stop_vision
            pl_start_vision "$tag" "$model" --tokenizer "$vd" --max-video-frames 30
            refused "more frames than --max-video-frames" "more than 30 frames" \
                --prompt 1,502,501,503 --video "$vd/clip0.mp4"
            pl_stop_vision
            pl_start_vision "$tag" "$model"
            grep -q "videos refused" "$PL_WORK/$tag.v.out" || pl_fail "no-tokenizer summary missing"
            refused "a vision stage without a tokenizer" "no tokenizer" --prompt 1,502,501,503 \
                --video "$vd/clip0.mp4"
            # still serving: the golden request again, through the same stages
            pl_stop_vision
            pl_start_vision "$tag" "$model" --tokenizer "$vd"
            pl_vclient "$tag" --prompt "$prompt" --max-tokens "$steps" "${files[@]}" >"$PL_WORK/$tag.after" ||
                pl_fail "$case: the golden request failed after the hostile ones"
            [ "$(pl_tokens_of "$PL_WORK/$tag.after" 0)" = "$want" ] || pl_fail "$case: tokens differ after hostile input"
            echo "after the hostile videos: the stages still give the golden tokens: yes"
            # Two different videos with the same grid and timestamps (32x32, 6 frames at 6 fps:
            # H.264 and HEVC) make the same prompt ids: the prefix cache must tell them apart
            # by their embeddings. B after A equals B on stages that never saw A.
            small="$PL_ROOT/tests/runtime/vision/fuzz_corpus/video"
            sp=1,2,3,502,501,503,4,5
            pl_vclient "$tag" --prompt "$sp" --max-tokens 8 --video "$small/h264.mp4" >"$PL_WORK/a1" ||
                pl_fail "video A: $(cat "$PL_WORK/a1")"
            pl_vclient "$tag" --prompt "$sp" --max-tokens 8 --video "$small/h264.mp4" >"$PL_WORK/a2" ||
                pl_fail "video A again: $(cat "$PL_WORK/a2")"
            [ "$(pl_tokens_of "$PL_WORK/a1" 0)" = "$(pl_tokens_of "$PL_WORK/a2" 0)" ] ||
                pl_fail "the same video twice gave different tokens"
            pl_vclient "$tag" --prompt "$sp" --max-tokens 8 --video "$small/hevc.mp4" >"$PL_WORK/b1" ||
                pl_fail "video B: $(cat "$PL_WORK/b1")"
            b_after_a=$(pl_tokens_of "$PL_WORK/b1" 0)
            # the check below means something only if the two videos answer differently
            [ "$b_after_a" != "$(pl_tokens_of "$PL_WORK/a1" 0)" ] ||
                pl_fail "videos A and B give the same tokens: the prefix-cache check would be blind"
        fi
        pl_stop_vision
        pl_stop_pipeline "$tag" "$S"
        if [ "$case" = qwen3_vl ] && [ "$split" = 0,1,2,4 ]; then # B on fresh stages
            for ((r = 0; r < S; r++)); do
                pl_start_stage "${tag}f" "$S" "$r" "$model" --max-seq 192 --max-batch 4 --chunk-size 16 \
                    --layer-start "${bounds[$r]}" --layer-end "${bounds[$((r + 1))]}"
            done
            pl_wait_ready "${tag}f" "$S"
            pl_start_vision "${tag}f" "$model" --tokenizer "$vd"
            pl_vclient "${tag}f" --prompt "$sp" --max-tokens 8 --video "$small/hevc.mp4" >"$PL_WORK/b2" ||
                pl_fail "video B on fresh stages: $(cat "$PL_WORK/b2")"
            [ "$(pl_tokens_of "$PL_WORK/b2" 0)" = "$b_after_a" ] ||
                pl_fail "video B after video A (same prompt ids) gave $b_after_a, on fresh stages $(pl_tokens_of "$PL_WORK/b2" 0)"
            echo "two videos with the same prompt ids: B after A == B on fresh stages ($b_after_a): yes"
            pl_stop_vision
            pl_stop_pipeline "${tag}f" "$S"
        fi
    done
done
echo "PASS"
