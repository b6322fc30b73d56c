#!/usr/bin/env bash
# strata-generate --image end to end, against what transformers made from the same committed
# image files (tests/golden/<case>/e2e, tools/golden/vl_image_golden.py): decode + HF's default
# processor + vision encoder + expansion + get_rope_index + the text stack. Greedy ids must
# equal HF's exactly and every step's logits (from --out) be within 1e-2 of HF's, at 1 and 2
# threads (and the two --out files byte-identical); hostile input exits 3 with a clear message.
set -euo pipefail
gen="$1"
root="${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/golden"
tmp="${TEST_TMPDIR:-/tmp}/generate_image.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/generate_lib.sh"

for case in qwen3_vl qwen3_vl_moe; do
    dir="$root/$case"
    e2e="$dir/e2e/e2e.json"
    prompt=$(json_list "$e2e" prompt_ids)
    want=$(json_list "$e2e" generated_ids | tr ',' ' ')
    steps=$(echo "$want" | wc -w)
    images=()
    for f in $(tr -d '\n ' <"$e2e" | grep -o '"file":"[^"]*"' | sed 's/"file":"\(.*\)"/\1/'); do
        images+=(--image "$dir/e2e/$f")
    done
    [ "${#images[@]}" -ge 4 ] || fail "$case: expected two images in $e2e"
    for threads in 1 2; do
        out=$("$gen" --model "$dir" --prompt-ids "$prompt" "${images[@]}" --max-tokens "$steps" \
            --ignore-eos --threads "$threads" --out "$tmp/$case.$threads.st" 2>"$tmp/err") ||
            fail "$case: exit $? ($(cat "$tmp/err"))"
        got=${out%%$'\n'*}
        [ "$got" = "$want" ] || fail "$case threads $threads: got '$got', want '$want'"
    done
    cmp -s "$tmp/$case.1.st" "$tmp/$case.2.st" || fail "$case: --out differs between 1 and 2 threads"
    read -r diff count < <(max_logit_diff "$tmp/$case.1.st" "$dir/e2e/logits.f32" "$steps")
    [ "$count" -gt 0 ] || fail "$case: no logits compared"
    awk -v d="$diff" 'BEGIN { exit !(d <= 1e-2) }' || fail "$case: max |dlogit| $diff > 1e-2"
    echo "ok: $case from image files: ids identical to transformers ($steps steps, 1 and 2 threads)," \
        "max |dlogit| $diff over $count values; $(grep '^images:' "$tmp/err")"
done

vl="$root/qwen3_vl"
head -c 700 "$vl/e2e/image0.png" >"$tmp/truncated.png"
printf 'GIF89a not an image' >"$tmp/image.gif"
expect_refused "truncated PNG" --model "$vl" --prompt-ids 1,502,500,503 --image "$tmp/truncated.png"
expect_refused "unsupported format" --model "$vl" --prompt-ids 1,502,500,503 --image "$tmp/image.gif"
expect_refused "missing file" --model "$vl" --prompt-ids 1,502,500,503 --image "$tmp/none.png"
expect_refused "two images for one image token" --model "$vl" --prompt-ids 1,502,500,503 \
    --image "$vl/e2e/image0.png" --image "$vl/e2e/image1.jpg"
expect_refused "image on a text model" --model "$root/qwen3_moe" --prompt-ids 1,2 \
    --image "$vl/e2e/image0.png"
