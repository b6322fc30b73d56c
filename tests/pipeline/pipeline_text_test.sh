#!/usr/bin/env bash
# Integration: text in, text out through a 2-stage pipeline. A tiny random checkpoint with the
# real Qwen3 vocabulary (151936 ids, hidden 64, 2 layers: ~20 MB, made in TEST_TMPDIR, never
# committed) sits next to the real Qwen3 tokenizer files. `strata-client --chat` must send the
# ids of the chat template's rendering (thinking off) and print exactly the decoded text of
# the ids a direct `--prompt <those ids>` run returns; `--text` sends the raw text's ids; and
# tools/strata_generate.sh (`./strata generate`) starts, answers and stops a pipeline itself.
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init
TOKENIZE="$PL_BIN/strata-tokenize"
model="$PL_WORK/model"
pl_make_text_model "$model"

# ids of a JSON string with the real tokenizer, as "1,2,3"
ids_of() { echo "$1" | "$TOKENIZE" --model "$model" --jsonl | tr -d '[] '; }
# --print-ids lines of a stderr file
ids_line() { sed -n "s/^$1 ids: //p" "$2"; }

pl_start_pipeline text 2 "$model" --max-seq 128
n=12
pl_client text --model "$model" --chat "Hello" --max-tokens $n --print-ids \
    >"$PL_WORK/chat.out" 2>"$PL_WORK/chat.err" || pl_fail "--chat failed: $(cat "$PL_WORK/chat.err")"
want=$(ids_of '"<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"')
got=$(ids_line prompt "$PL_WORK/chat.err")
[ -n "$want" ] && [ "$got" = "$want" ] || pl_fail "--chat prompt ids $got, want $want"
# The same prompt ids sent directly, stopping at the same eos (<|im_end|>).
pl_client text --prompt "$got" --max-tokens $n --stop 151645 >"$PL_WORK/direct.out" ||
    pl_fail "direct run failed: $(cat "$PL_WORK/direct.out")"
direct=$(pl_tokens_of "$PL_WORK/direct.out" 0)
[ "$(ids_line generated "$PL_WORK/chat.err")" = "$direct" ] ||
    pl_fail "--chat generated $(ids_line generated "$PL_WORK/chat.err"), direct run $direct"
# Text out == the direct run's ids decoded (special tokens skipped), plus the final newline.
{ echo "[$direct]" | "$TOKENIZE" --model "$model" --decode --skip-special; echo; } >"$PL_WORK/want.txt"
cmp -s "$PL_WORK/chat.out" "$PL_WORK/want.txt" ||
    pl_fail "--chat printed '$(cat "$PL_WORK/chat.out")', decoded ids give '$(cat "$PL_WORK/want.txt")'"
grep -q "^usage: [0-9]* prompt tokens, [0-9]* generated tokens" "$PL_WORK/chat.err" ||
    pl_fail "no usage line: $(cat "$PL_WORK/chat.err")"
echo "chat: prompt $got -> $direct; text identical ($(wc -c <"$PL_WORK/chat.out") bytes)"
grep '^usage:' "$PL_WORK/chat.err"

# Sampled (seeded), so the answer is many different tokens, some of them pieces of one
# character: the streamed text must still be exactly the decoded ids.
sample=(--temperature 1.0 --top-k 0 --seed 12345 --max-tokens 48)
pl_client text --model "$model" --chat "Write a poem about ÿ and 你好 😀" "${sample[@]}" \
    --print-ids >"$PL_WORK/s.out" 2>"$PL_WORK/s.err" || pl_fail "sampled --chat failed"
pl_client text --prompt "$(ids_line prompt "$PL_WORK/s.err")" "${sample[@]}" --stop 151645 \
    >"$PL_WORK/s.direct" || pl_fail "sampled direct run failed"
sdirect=$(pl_tokens_of "$PL_WORK/s.direct" 0)
[ "$(ids_line generated "$PL_WORK/s.err")" = "$sdirect" ] || pl_fail "sampled ids differ"
{ echo "[$sdirect]" | "$TOKENIZE" --model "$model" --decode --skip-special; echo; } >"$PL_WORK/s.want"
cmp -s "$PL_WORK/s.out" "$PL_WORK/s.want" || pl_fail "sampled text differs from the decoded ids"
echo "sampled chat: $(echo "$sdirect" | tr ',' '\n' | sort -u | wc -l) distinct tokens of $(echo "$sdirect" | tr ',' '\n' | wc -l); text identical"

# --think leaves out the empty think block; --text sends the raw text's ids.
pl_client text --model "$model" --chat "Hello" --think --max-tokens 2 --print-ids \
    >/dev/null 2>"$PL_WORK/think.err" || pl_fail "--think failed: $(cat "$PL_WORK/think.err")"
want=$(ids_of '"<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"')
[ "$(ids_line prompt "$PL_WORK/think.err")" = "$want" ] || pl_fail "--think prompt ids differ"
pl_client text --model "$model" --text "Hello, world! 你好" --max-tokens 2 --print-ids \
    >/dev/null 2>"$PL_WORK/raw.err" || pl_fail "--text failed: $(cat "$PL_WORK/raw.err")"
[ "$(ids_line prompt "$PL_WORK/raw.err")" = "$(ids_of '"Hello, world! 你好"')" ] ||
    pl_fail "--text prompt ids differ"
pl_stop_pipeline text 2
echo "think and raw text: prompt ids ok"

# A model directory with an unknown chat template is refused, naming the file.
mkdir -p "$PL_WORK/other" && cp "$model"/* "$PL_WORK/other/"
printf '{"chat_template": "{{ messages }}"}\n' >"$PL_WORK/other/tokenizer_config.json"
"$PL_CLIENT" --port 1 --model "$PL_WORK/other" --chat hi >/dev/null 2>"$PL_WORK/unknown.err" &&
    pl_fail "an unknown chat template was rendered"
grep -q "tokenizer_config.json: unknown chat template" "$PL_WORK/unknown.err" ||
    pl_fail "unclear refusal: $(cat "$PL_WORK/unknown.err")"
echo "unknown template: refused"
for bad in "--text hi" "--model $model --text a --chat b" "--model $model --text a --prompt 1" \
    "--model $model --text a --system s"; do
    # shellcheck disable=SC2086
    "$PL_CLIENT" --port 1 $bad >/dev/null 2>&1
    [ $? -eq 2 ] || pl_fail "strata-client $bad: want usage exit 2"
done
echo "text-mode usage errors: exit 2"

# ./strata generate's script: its own 1-stage pipeline, the same answer.
STRATA_BIN_DIR="$(dirname "$PL_BIN")" "$PL_ROOT/tools/strata_generate.sh" --model "$model" \
    --stages 1 --max-tokens $n "Hello" >"$PL_WORK/gen.out" 2>"$PL_WORK/gen.err" ||
    pl_fail "strata_generate.sh failed: $(cat "$PL_WORK/gen.err")"
cmp -s "$PL_WORK/gen.out" "$PL_WORK/want.txt" || pl_fail "generate printed '$(cat "$PL_WORK/gen.out")'"
echo "generate (1 stage): same text"
