#!/bin/bash
# End-to-end test of strata-tokenize on the committed Qwen3 tokenizer: --jsonl encode and
# decode (ids checked against HF tokenizers 0.22.1), raw mode, and the documented exit codes
# (1 bad input line, with its number; 2 usage; 3 bad tokenizer files).
set -u
tok="$1"
model="$2"
fail=0

check() { # name, stdin, expected exit code, expected output substring, args...
    local name="$1" input="$2" want_rc="$3" want_text="$4"
    shift 4
    local out rc
    out="$(printf '%b' "$input" | "$tok" "$@" 2>&1)"
    rc=$?
    if [[ $rc -ne $want_rc ]]; then
        echo "FAIL $name: exit $rc, want $want_rc"; echo "$out"; fail=1; return
    fi
    if [[ "$out" != *"$want_text"* ]]; then
        echo "FAIL $name: output lacks \"$want_text\""; echo "$out"; fail=1; return
    fi
    echo "ok   $name"
}

chat='"<|im_start|>user\\nhi<|im_end|>"\n'
check encode '"hello world"\n' 0 "[14990,1879]" --model "$model" --jsonl
check encode-chat "$chat" 0 "[151644,872,198,6023,151645]" --model "$model" --jsonl
check encode-lines '"a"\n"b"\n' 0 $'[64]\n[65]' --model "$model" --jsonl
check decode '[151644,872,198,6023,151645]\n' 0 '"<|im_start|>user\nhi<|im_end|>"' \
    --model "$model" --jsonl --decode
check decode-skip '[151644,872,198,6023,151645]\n' 0 '"user\nhi"' \
    --model "$model" --jsonl --decode --skip-special
check decode-split-char '[145368]\n' 0 '"☘"' --model "$model" --jsonl --decode
check raw-encode 'héllo' 0 "[71,18503,385]" --model "$model"
check raw-decode '[14990,1879]' 0 "hello world" --model "$model" --decode
check help '' 0 "usage: strata-tokenize" --help
check no-model '' 2 "--model is required"
check bad-flag '' 2 "usage" --model "$model" --nope
check bad-max-line '' 2 "--max-line-bytes" --model "$model" --max-line-bytes 0
check missing-dir '' 3 "tokenizer.json" --model /nonexistent/tokenizer --jsonl
check not-a-string '"a"\n42\n' 1 "stdin line 2: expected a JSON string" --model "$model" --jsonl
check bad-json '"a"\n"b"\n"c\n' 1 "stdin line 3: not valid JSON" --model "$model" --jsonl
check bad-utf8 '"ok\xff"\n' 1 "stdin line 1: invalid UTF-8 at byte offset 2" --model "$model" --jsonl
check nul '"a\\u0000b"\n' 1 "stdin line 1: \\u0000 is not supported" --model "$model" --jsonl
check long-line '"aaaaaaaaaaaaaaaaaaaa"\n' 1 "stdin line 1: longer than 8 bytes" \
    --model "$model" --jsonl --max-line-bytes 8
check unknown-id '[1,999999]\n' 1 "stdin line 1: id 999999 at position 1 is not a token" \
    --model "$model" --jsonl --decode
check not-ids '["x"]\n' 1 "element 0 is not an integer id" --model "$model" --jsonl --decode

bad=$(mktemp -d)
echo '{"model": {"type": "BPE", "vocab": {"a": 0}}}' >"$bad/tokenizer.json"
check bad-tokenizer '"a"\n' 3 "model.merges is missing" --model "$bad" --jsonl
rm -rf "$bad"

exit $fail
