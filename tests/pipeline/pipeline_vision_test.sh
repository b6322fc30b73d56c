#!/usr/bin/env bash
# Integration: the vision stage (strata-stage --role vision) in front of three language
# stages on loopback, driven by strata-client --image with the committed e2e image files
# (tests/golden/<case>/e2e). For both VL goldens, on the split cut between the DeepStack
# layers ([0,1) [1,2) [2,4)): the generated ids equal transformers' and the last stage's
# logits are within 1e-2 of e2e/logits.f32 (printed); the transfer goes in blocks of 5 image
# tokens. A link to stage 0 dropped after block k (--test-drop-after-block, every k) resumes
# to the same tokens and a byte-identical --out. A text-only request through the vision stage
# equals the same request sent to stage 0 directly (tokens and --out bytes). Hostile images
# (truncated, unsupported format, zero size, decompression bomb, aspect ratio > 200, a file
# over --max-image-bytes, a request over --max-request-bytes) are refused with a clear error
# while every stage keeps serving; stage 0 refuses image files sent to it directly.
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init
LOGITS_DIFF="$PL_ROOT/tests/pipeline/logits_diff"
[ -x "$LOGITS_DIFF" ] || pl_fail "logits_diff not found at $LOGITS_DIFF"

e2e_list() { sed -n "/\"$1\": \[/,/\]/p" "$2" | tr -d ' \n' | grep -o '\[[0-9,]*\]' | tr -d '[]'; }
e2e_files() { sed -n 's/.*"file": *"\([^"]*\)".*/\1/p' "$1"; }

# --help, usage errors (exit 2) and a model without a vision tower (exit 3).
"$PL_STAGE" --role vision --help | grep -q -- "--vision-block-tokens" || pl_fail "no --role vision --help"
"$PL_STAGE" --help | grep -q -- "--role language|vision" || pl_fail "strata-stage --help does not name --role"
"$PL_STAGE" --role vision --insecure >/dev/null 2>&1
[ $? -eq 2 ] || pl_fail "--role vision without --model is not a usage error (exit 2)"
"$PL_STAGE" --role vision --device tpu:0 --model x --next-port 9 >/dev/null 2>"$PL_WORK/vdev.err"
[ $? -eq 2 ] || pl_fail "--role vision --device tpu:0 is not a usage error (exit 2)"
grep -q "cpu, cuda or cuda:N" "$PL_WORK/vdev.err" || pl_fail "unclear refusal: $(cat "$PL_WORK/vdev.err")"
"$PL_STAGE" --role sideways --model x >/dev/null 2>&1
[ $? -eq 2 ] || pl_fail "--role sideways is not a usage error (exit 2)"
"$PL_STAGE" --role vision --model "$(pl_golden qwen3_moe)" --next-port 9 --insecure >/dev/null 2>"$PL_WORK/novision.err"
[ $? -eq 3 ] || pl_fail "a text model is not a bad-model error (exit 3) for --role vision"
grep -q "has no vision tower" "$PL_WORK/novision.err" || pl_fail "unclear error: $(cat "$PL_WORK/novision.err")"

# --chat with --image: one image part per file before the text, as the Qwen3-VL template
# renders it (<|vision_start|><|image_pad|><|vision_end|> each; the Qwen3 vocabulary's ids).
chat="$PL_WORK/vl-chat"
mkdir -p "$chat"
cp "$PL_ROOT/tests/runtime/text/testdata/qwen3-tokenizer/tokenizer.json" \
    "$PL_ROOT/tests/runtime/text/testdata/qwen3-tokenizer/tokenizer_config.json" \
    "$PL_ROOT/tests/runtime/text/testdata/qwen3-vl-chat-template/chat_template.json" "$chat/"
e2e0="$(pl_golden qwen3_vl)/e2e"
"$PL_CLIENT" --port 1 --insecure --model "$chat" --chat "What is in these pictures?" --print-ids \
    --image "$e2e0/image0.png" --image "$e2e0/image1.jpg" >/dev/null 2>"$PL_WORK/chat.err"
ids=$(sed -n 's/^prompt ids: //p' "$PL_WORK/chat.err")
# <|im_start|> user \n, then vision_start / image_pad / vision_end per image, then the text.
case "$ids" in
151644,872,198,151652,151655,151653,151652,151655,151653,[0-9]*) ;;
*) pl_fail "--chat --image rendered $ids" ;;
esac
[ "$(echo "$ids" | tr ',' '\n' | grep -c '^151655$')" = 2 ] || pl_fail "--chat --image: not 2 image pads: $ids"
echo "--chat with two --image: user turn = 2 x <|vision_start|><|image_pad|><|vision_end|> + text: yes"

for case in qwen3_vl qwen3_vl_moe; do
    model=$(pl_golden "$case")
    e2e="$model/e2e"
    [ -f "$e2e/e2e.json" ] || pl_fail "$e2e/e2e.json missing"
    prompt=$(e2e_list prompt_ids "$e2e/e2e.json")
    want=$(e2e_list generated_ids "$e2e/e2e.json")
    steps=$(echo "$want" | tr ',' '\n' | wc -l)
    images=()
    for f in $(e2e_files "$e2e/e2e.json"); do images+=(--image "$e2e/$f"); done
    tag="${case}_v"
    out="$PL_WORK/$tag.safetensors"
    bounds=(0 1 2 4)
    for r in 0 1 2; do
        pl_start_stage "$tag" 3 "$r" "$model" --max-seq 128 --max-batch 4 --chunk-size 8 \
            --layer-start "${bounds[$r]}" --layer-end "${bounds[$((r + 1))]}" --out "$out"
    done
    pl_wait_ready "$tag" 3
    pl_start_vision "$tag" "$model" --vision-block-tokens 5 --max-image-bytes 4096
    pl_vclient "$tag" --prompt "$prompt" --max-tokens "$steps" "${images[@]}" >"$PL_WORK/$tag.client" ||
        pl_fail "$case: client failed: $(cat "$PL_WORK/$tag.client")"
    got=$(pl_tokens_of "$PL_WORK/$tag.client" 0)
    [ "$got" = "$want" ] || pl_fail "$case: tokens $got, golden $want"
    pl_wait_file "$out" 5 || pl_fail "$case: no --out file"
    diff_line=$("$LOGITS_DIFF" "$out" "$e2e/logits.f32" 1e-2) || pl_fail "$case: $diff_line"
    cp "$out" "$PL_WORK/$tag.first"
    blocks=$(sed -n 's/.*tokens in \([0-9]*\) blocks sent to stage 0.*/\1/p' "$PL_WORK/$tag.v.log" | head -1)
    echo "$case: $((${#images[@]} / 2)) images, vision stage + 3 stages: tokens match golden; $diff_line; $blocks blocks"

    # Text only through the vision stage == directly to stage 0.
    text=$(echo "$prompt" | tr ',' '\n' | grep -v '^500$' | paste -sd,)
    rm -f "$out"
    pl_vclient "$tag" --prompt "$text" --max-tokens 8 >"$PL_WORK/$tag.text_v" || pl_fail "$case: text via vision failed"
    pl_wait_file "$out" 5 || pl_fail "$case: no --out for the text request"
    mv "$out" "$PL_WORK/$tag.text_v.st"
    pl_client "$tag" --prompt "$text" --max-tokens 8 >"$PL_WORK/$tag.text_d" || pl_fail "$case: text direct failed"
    [ "$(pl_tokens_of "$PL_WORK/$tag.text_v" 0)" = "$(pl_tokens_of "$PL_WORK/$tag.text_d" 0)" ] ||
        pl_fail "$case: a text request through the vision stage differs from stage 0 direct"
    pl_wait_file "$out" 5 || pl_fail "$case: no --out for the direct text request"
    cmp -s "$out" "$PL_WORK/$tag.text_v.st" || pl_fail "$case: text --out differs via the vision stage"
    echo "$case: text-only request through the vision stage = stage 0 direct: yes"

    # Two image requests at once from one client, with a text client beside them.
    pl_vclient "$tag" --prompt "$text" --max-tokens 8 >"$PL_WORK/$tag.text_c" &
    tpid=$!
    pl_vclient "$tag" --prompt "$prompt" --copies 2 --max-tokens "$steps" "${images[@]}" \
        >"$PL_WORK/$tag.two" || pl_fail "$case: two concurrent image requests failed: $(cat "$PL_WORK/$tag.two")"
    wait "$tpid" || pl_fail "$case: the concurrent text request failed"
    [ "$(pl_tokens_of "$PL_WORK/$tag.two" 0)" = "$want" ] && [ "$(pl_tokens_of "$PL_WORK/$tag.two" 1)" = "$want" ] ||
        pl_fail "$case: concurrent image requests differ from golden"
    [ "$(pl_tokens_of "$PL_WORK/$tag.text_c" 0)" = "$(pl_tokens_of "$PL_WORK/$tag.text_d" 0)" ] ||
        pl_fail "$case: the concurrent text request differs"
    echo "$case: two image requests + a text request at once: golden ids: yes"

    # Stage 0 refuses image files sent to it directly (they belong to a vision stage).
    pl_client "$tag" --prompt "$prompt" --max-tokens 2 "${images[@]}" >"$PL_WORK/$tag.direct" 2>&1 &&
        pl_fail "$case: stage 0 accepted image files"
    grep -q "decoded and encoded by a vision stage" "$PL_WORK/$tag.direct" ||
        pl_fail "$case: unclear refusal of image files at stage 0: $(cat "$PL_WORK/$tag.direct")"
    pl_stop_vision

    # A cut after every block resumes to the same result.
    for ((k = 0; k < blocks; k++)); do
        pl_start_vision "$tag" "$model" --vision-block-tokens 5 --test-drop-after-block "$k"
        rm -f "$out"
        pl_vclient "$tag" --prompt "$prompt" --max-tokens "$steps" "${images[@]}" >"$PL_WORK/$tag.cut$k" ||
            pl_fail "$case: cut after block $k: client failed: $(cat "$PL_WORK/$tag.cut$k")"
        [ "$(pl_tokens_of "$PL_WORK/$tag.cut$k" 0)" = "$want" ] || pl_fail "$case: cut after block $k: tokens differ"
        grep -q "resuming transfers" "$PL_WORK/$tag.v.log" || pl_fail "$case: cut after block $k: no resume logged"
        pl_wait_file "$out" 5 || pl_fail "$case: cut after block $k: no --out"
        cmp -s "$out" "$PL_WORK/$tag.first" || pl_fail "$case: cut after block $k: --out differs from the unbroken run"
        pl_stop_vision
    done
    echo "$case: link to stage 0 cut after each of $blocks blocks: resumed, byte-identical --out: yes"
    [ "$case" = qwen3_vl ] || { pl_stop_pipeline "$tag" 3; continue; }

    # Hostile images: each refused with a clear error; the stages keep serving.
    pl_start_vision "$tag" "$model" --vision-block-tokens 5 --max-image-bytes 4000 --max-request-bytes 65536
    h="$PL_WORK/hostile"
    mkdir -p "$h"
    head -c 300 "$e2e/image0.png" >"$h/truncated.png"
    printf 'GIF89a\001\000\001\000\000\000\000;' >"$h/image.gif"
    python3 - "$h" <<'PY' || pl_fail "cannot write the hostile PNGs"
import struct, sys, zlib
def png(path, w, h, rows=None):
    def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    if rows is not None: data += chunk(b"IDAT", zlib.compress(rows))
    open(path, "wb").write(data + chunk(b"IEND", b""))
png(sys.argv[1] + "/zero.png", 0, 0)
png(sys.argv[1] + "/bomb.png", 100000, 100000)
png(sys.argv[1] + "/wide.png", 402, 2, (b"\0" + b"\x80" * 402 * 3) * 2)
PY
    head -c 1500 /dev/urandom >"$h/blob.png"
    cat "$e2e/image0.png" "$e2e/image0.png" "$e2e/image0.png" >"$h/big.png"
    check_refused() { # NAME FILE PATTERN
        pl_vclient "$tag" --prompt "502,500,503" --max-tokens 2 --image "$2" >"$h/$1.out" 2>&1 &&
            pl_fail "$case: the $1 image was accepted"
        grep -q -- "$3" "$h/$1.out" || pl_fail "$case: unclear refusal of the $1 image: $(cat "$h/$1.out")"
        echo "$case: $1 image refused: $(grep -o 'vision stage: bad image request.*' "$h/$1.out" | head -c 160)"
    }
    check_refused truncated "$h/truncated.png" "image 1 of 1"
    check_refused gif "$h/image.gif" "image 1 of 1"
    check_refused random "$h/blob.png" "image 1 of 1"
    check_refused zero "$h/zero.png" "image 1 of 1"
    check_refused bomb "$h/bomb.png" "image 1 of 1"
    check_refused wide "$h/wide.png" "aspect ratio"
    check_refused oversized "$h/big.png" "the limit is 4000"
    head -c 70000 /dev/urandom >"$h/huge.jpg"
    pl_vclient "$tag" --prompt "502,500,503" --max-tokens 2 --image "$h/huge.jpg" >"$h/huge.out" 2>&1 &&
        pl_fail "$case: a request over --max-request-bytes was accepted"
    grep -q "announced a frame of" "$h/huge.out" || pl_fail "$case: unclear refusal of a large request: $(cat "$h/huge.out")"
    echo "$case: request over --max-request-bytes refused: $(grep -o 'announced a frame.*' "$h/huge.out" | head -c 120)"
    rm -f "$out"
    pl_vclient "$tag" --prompt "$prompt" --max-tokens "$steps" "${images[@]}" >"$PL_WORK/$tag.again" ||
        pl_fail "$case: the vision stage stopped serving after hostile images"
    [ "$(pl_tokens_of "$PL_WORK/$tag.again" 0)" = "$want" ] || pl_fail "$case: tokens after hostile images differ"
    echo "$case: after the refusals the same ring still gives the golden ids: yes"
    pl_stop_vision
    pl_stop_pipeline "$tag" 3
done
echo "PASS"
