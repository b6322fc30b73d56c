#!/usr/bin/env bash
# Demo of pipeline inference: builds strata-stage and strata-client, starts a 4-stage
# pipeline on loopback (one process per stage, each owning one layer of a committed tiny
# Qwen3-MoE checkpoint and its own KV cache), generates from the golden prompt, prints the
# tokens and tokens/s, then runs the same request on a single stage and compares tokens and
# every step's logits byte for byte. Exit 0 only when they are identical. Every link runs
# TLS 1.3 with a pre-shared key made for this run ($STRATA_AUTH_KEY).
# Then text in, text out: a seeded random checkpoint with the real Qwen3 vocabulary (151,936 ids,
# written at demo time into the scratch directory, not committed) and the real Qwen3 tokenizer;
# one chat message goes through a 4-stage pipeline and the answer streams back as text (random
# weights, sampled at temperature 0.8: real Qwen3 tokens, no meaning).
# Usage: tools/pipeline_demo.sh [golden case, default qwen3_moe] [stages, default 4]
# Env: STRATA_BAZEL_FLAGS, extra flags for bazel build (e.g. --define=strata_cuda=0).
set -u
cd "$(dirname "$0")/.."
case=${1:-qwen3_moe}
S=${2:-4}
echo "== build"
targets="//runtime:strata-stage //runtime:strata-client //runtime:strata-stage-bench"
bazel build ${STRATA_BAZEL_FLAGS:-} $targets >/dev/null 2>&1 ||
    { bazel build ${STRATA_BAZEL_FLAGS:-} $targets; exit 1; }
STRATA_BIN_DIR="$(bazel info ${STRATA_BAZEL_FLAGS:-} bazel-bin 2>/dev/null)"
export STRATA_BIN_DIR
. tests/pipeline/pipeline_lib.sh
pl_init
model=$(pl_golden "$case")
[ -f "$model/config.json" ] || pl_fail "no golden model tests/golden/$case"
prompt=$(pl_golden_prompt "$case")
steps=$(pl_golden_steps "$case")

head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PL_WORK/key"
STRATA_AUTH_KEY="$(cat "$PL_WORK/key")"
export STRATA_AUTH_KEY

echo "== start a $S-stage pipeline on loopback ($case)"
pl_start_pipeline demo "$S" "$model" --max-seq 256 --chunk-size 8 --out "$PL_WORK/pipeline.st"
sed -n 's/.*info: links: /links: /p' "$PL_WORK/demo.0.log" | head -n 1
for ((r = 0; r < S; r++)); do
    echo "stage $r: $(grep '^shard:' "$PL_WORK/demo.$r.out"), port $(cat "$PL_WORK/demo.$r.port")"
done
echo "== generate"
echo "prompt ids: $prompt"
pl_client demo --prompt "$prompt" --max-tokens "$steps" >"$PL_WORK/pipeline.client" ||
    pl_fail "generation failed: $(cat "$PL_WORK/pipeline.client")"
sed -n 's/^request 0: tokens /tokens: /p; s/^request 0: \([0-9]* tokens.*\)/\1/p' "$PL_WORK/pipeline.client"
pl_wait_file "$PL_WORK/pipeline.st" 5 || pl_fail "the last stage wrote no --out file"
pl_stop_pipeline demo "$S"

echo "== single stage, same request"
pl_start_pipeline single 1 "$model" --max-seq 256 --chunk-size 8 --out "$PL_WORK/single.st"
pl_client single --prompt "$prompt" --max-tokens "$steps" >"$PL_WORK/single.client" ||
    pl_fail "single-stage generation failed"
pl_wait_file "$PL_WORK/single.st" 5 || pl_fail "no single-stage --out file"
pl_stop_pipeline single 1
same=no
if [ "$(pl_tokens_of "$PL_WORK/pipeline.client" 0)" = "$(pl_tokens_of "$PL_WORK/single.client" 0)" ] &&
    cmp -s "$PL_WORK/pipeline.st" "$PL_WORK/single.st"; then
    same=yes
fi
echo "identical to single-stage: $same (tokens and all $steps steps of logits compared bitwise)"
[ "$same" = yes ] || exit 1

echo "== text in, text out: random weights, the real Qwen3 vocabulary and tokenizer, $S stages"
qr="$PL_WORK/qwen3-random-vocab"
"$STRATA_BIN_DIR/runtime/strata-stage-bench" make-model --out "$qr" --vocab 151936 --hidden 128 \
    --layers 4 --intermediate 256 --heads 4 --kv-heads 2 --head-dim 32 --seed 7 ||
    pl_fail "could not write the random checkpoint"
cp tests/runtime/text/testdata/qwen3-tokenizer/tokenizer.json \
    tests/runtime/text/testdata/qwen3-tokenizer/tokenizer_config.json "$qr/"
message="Write a haiku about pipelines."
echo "user: $message"
printf 'assistant: '
tools/strata_generate.sh --model "$qr" --stages "$S" --max-tokens 24 --temperature 0.8 --seed 3 "$message" 2>"$PL_WORK/text.err" ||
    pl_fail "text generation failed: $(cat "$PL_WORK/text.err")"
echo
grep '^usage:' "$PL_WORK/text.err"

echo "== images in: a vision stage in front of $S language stages (qwen3_vl, two committed images)"
vl=$(pl_golden qwen3_vl)
e2e="$vl/e2e"
vprompt=$(sed -n '/"prompt_ids": \[/,/\]/p' "$e2e/e2e.json" | tr -d ' \n' | grep -o '\[[0-9,]*\]' | tr -d '[]')
pl_start_pipeline vdemo "$S" "$vl" --max-seq 256 --chunk-size 8
pl_start_vision vdemo "$vl" --vision-block-tokens 8
grep -E '^(vision tower|transfer):' "$PL_WORK/vdemo.v.out"
echo "images: $e2e/image0.png, $e2e/image1.jpg; prompt ids (one image token each): $vprompt"
pl_vclient vdemo --prompt "$vprompt" --max-tokens 24 --image "$e2e/image0.png" --image "$e2e/image1.jpg" \
    >"$PL_WORK/vdemo.client" || pl_fail "image generation failed: $(cat "$PL_WORK/vdemo.client")"
sed -n 's/.*info: \(request [0-9]*: [0-9]* image.*\)/vision stage: \1/p; s/.*info: \(request [0-9]*: [0-9]* image tokens in.*\)/vision stage: \1/p' "$PL_WORK/vdemo.v.log"
sed -n 's/^request 0: tokens /tokens: /p' "$PL_WORK/vdemo.client"
want=$(sed -n '/"generated_ids": \[/,/\]/p' "$e2e/e2e.json" | tr -d ' \n' | grep -o '\[[0-9,]*\]' | tr -d '[]')
got=$(pl_tokens_of "$PL_WORK/vdemo.client" 0)
echo "transformers' ids from the same files: $([ "$got" = "$want" ] && echo match || echo DIFFER)"
pl_stop_vision
pl_stop_pipeline vdemo "$S"
[ "$got" = "$want" ] || exit 1
