#!/usr/bin/env bash
# strata-generate --video end to end, against what transformers made from the same committed
# video files (tests/golden/<case>/video, tools/golden/vl_video_golden.py): FFmpeg decoding as
# torchcodec does + HF's video processor + the timestamped prompt expansion (the golden's
# byte-level tokenizer) + vision encoder + get_rope_index + the text stack. The dense case is an
# H.264 MP4 alone; the MoE case a PNG-from-JPEG image then a VP9 WebM, labelled "Picture 1: " /
# "Video 1: " as the chat template writes with add_vision_id. Greedy ids must equal HF's, every
# step's logits (from --out) be within 1e-2 of HF's, at 1 and 2 threads (the --out files
# byte-identical); hostile input exits 3 with a clear message.
set -euo pipefail
gen="$1"
root="${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/golden"
tmp="${TEST_TMPDIR:-/tmp}/generate_video.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/generate_lib.sh"
json_files() { tr -d '\n ' <"$1" | grep -o "\"$2\":\[[^]]*\]" | grep -o '"file":"[^"]*"' | sed 's/"file":"\(.*\)"/\1/'; }

for case in qwen3_vl qwen3_vl_moe; do
    dir="$root/$case"
    vj="$dir/video/video.json"
    prompt=$(json_list "$vj" prompt_ids)
    want=$(json_list "$vj" generated_ids | tr ',' ' ')
    expanded=$(json_list "$vj" expanded_ids | awk -F, '{ print NF }')
    steps=$(echo "$want" | wc -w)
    files=()
    for f in $(json_files "$vj" images); do files+=(--image "$dir/video/$f"); done
    for f in $(json_files "$vj" videos); do files+=(--video "$dir/video/$f"); done
    for threads in 1 2; do
        out=$("$gen" --model "$dir" --prompt-ids "$prompt" "${files[@]}" --tokenizer "$dir/video" \
            --max-tokens "$steps" --ignore-eos --threads "$threads" --out "$tmp/$case.$threads.st" \
            2>"$tmp/err") || fail "$case: exit $? ($(cat "$tmp/err"))"
        got=${out%%$'\n'*}
        [ "$got" = "$want" ] || fail "$case threads $threads: got '$got', want '$want'"
        grep -q "prompt [0-9]* -> $expanded ids" "$tmp/err" ||
            fail "$case: the expanded prompt is not HF's $expanded ids: $(grep '^images:' "$tmp/err")"
    done
    cmp -s "$tmp/$case.1.st" "$tmp/$case.2.st" || fail "$case: --out differs between 1 and 2 threads"
    read -r diff count < <(max_logit_diff "$tmp/$case.1.st" "$dir/video/logits.f32" "$steps")
    [ "$count" -gt 0 ] || fail "$case: no logits compared"
    awk -v d="$diff" 'BEGIN { exit !(d <= 1e-2) }' || fail "$case: max |dlogit| $diff > 1e-2"
    echo "ok: $case from ${files[*]##*/}: ids identical to transformers ($steps steps, 1 and 2" \
        "threads), max |dlogit| $diff over $count values; $(grep '^images:' "$tmp/err")"
done

vl="$root/qwen3_vl"
clip="$vl/video/clip0.mp4"
head -c 20000 "$clip" >"$tmp/truncated.mp4"
printf 'RIFF....AVI LIST' >"$tmp/clip.avi"
expect_refused "truncated MP4" --model "$vl" --prompt-ids 1,502,501,503 --video "$tmp/truncated.mp4" \
    --tokenizer "$vl/video"
expect_refused "unsupported container" --model "$vl" --prompt-ids 1,502,501,503 \
    --video "$tmp/clip.avi" --tokenizer "$vl/video"
expect_refused "missing file" --model "$vl" --prompt-ids 1,502,501,503 --video "$tmp/none.mp4" \
    --tokenizer "$vl/video"
expect_refused "no tokenizer for the timestamps" --model "$vl" --prompt-ids 1,502,501,503 \
    --video "$clip"
expect_refused "two videos for one video token" --model "$vl" --prompt-ids 1,502,501,503 \
    --video "$clip" --video "$clip" --tokenizer "$vl/video"
expect_refused "an expanded video token run" --model "$vl" --prompt-ids 1,502,501,501,503 \
    --video "$clip" --tokenizer "$vl/video"
expect_refused "video on a text model" --model "$root/qwen3_moe" --prompt-ids 1,2 --video "$clip"
