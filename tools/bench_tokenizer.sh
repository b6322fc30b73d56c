#!/usr/bin/env bash
# `./strata bench tokenizer`: encode MB/s of Strata's C tokenizer next to Hugging Face
# `tokenizers` (the pinned version in tools/requirements.txt) on the same corpus, in one run,
# one thread each, interleaved BENCH_REPEAT times (default 3, medians printed), with a check
# that both produced the same ids (FNV-1a hash of one round). A benchmark, not a test.
# Corpus: the tokenizer golden's 2,000+ strings (ASCII, CJK, Korean, Arabic, emoji, code,
# whitespace runs, special tokens inline), each encoded on its own, BENCH_ROUNDS rounds (20).
# The Python side runs from a small venv holding only `tokenizers`
# (STRATA_TOKENIZERS_VENV, default ~/.cache/strata/tokenizers-venv). The ids are compared text by
# text; none may differ (NFC as HF computes it: runtime/text/nfc.h, tests/runtime/text).
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=${BENCH_REPEAT:-3}
rounds=${BENCH_ROUNDS:-20}
model=tests/runtime/text/testdata/qwen3-tokenizer
corpus=tests/runtime/text/testdata/tokenizer_golden.jsonl
venv=${STRATA_TOKENIZERS_VENV:-$HOME/.cache/strata/tokenizers-venv}
py="$venv/bin/python"
pin=$(grep '^tokenizers==' tools/requirements.txt)
log() { printf 'bench tokenizer: %s\n' "$*" >&2; }

if ! [ -x "$py" ] || ! "$py" -c "import tokenizers; assert tokenizers.__version__ == '${pin#*==}'" 2>/dev/null; then
    log "installing $pin into $venv"
    [ -x "$py" ] || python3 -m venv "$venv"
    "$py" -m pip install -q "$pin" >&2
fi
bazel build ${STRATA_BAZEL_FLAGS:-} //runtime/text:strata-bench-tokenizer >&2 2>/dev/null ||
    bazel build ${STRATA_BAZEL_FLAGS:-} //runtime/text:strata-bench-tokenizer
bin=$(bazel info ${STRATA_BAZEL_FLAGS:-} bazel-bin 2>/dev/null)/runtime/text/strata-bench-tokenizer

field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ours=() one=() batch=()
for r in $(seq 1 "$repeat"); do
    a=$("$bin" --model "$model" --corpus "$corpus" --repeat "$rounds" --ids-out "$tmp/strata.ids")
    b=$("$py" tools/bench_tokenizer.py --model "$model" --corpus "$corpus" --repeat "$rounds" --ids-out "$tmp/hf.ids")
    log "run $r: $a"
    printf '%s\n' "$b" | while read -r line; do log "run $r: $line"; done
    ours+=("$(echo "$a" | field mb_per_s)")
    one+=("$(echo "$b" | sed -n 1p | field mb_per_s)") batch+=("$(echo "$b" | sed -n 2p | field mb_per_s)")
    hf=$(echo "$b" | sed -n 1p | field impl)
    info=$(echo "$a" | sed 's/.*texts=\([^ ]*\) bytes=\([^ ]*\) ids=\([^ ]*\).*/\1 texts, \2 bytes, \3 ids/')
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
mo=$(median "${ours[@]}") m1=$(median "${one[@]}") mb=$(median "${batch[@]}")
texts=$(wc -l <"$tmp/strata.ids")
differ=$(paste -d '|' "$tmp/strata.ids" "$tmp/hf.ids" | awk -F'|' '$1 != $2' | wc -l)
echo "tokenizer encode, 1 thread, corpus: $info per round, $rounds rounds, median of $repeat"
printf '  %-40s %8s MB/s\n' "strata (C), tokenizer_encode per text" "$mo" \
    "${hf%-encode} encode per text" "$m1" "${hf%-encode} encode_batch" "$mb"
awk -v a="$mo" -v b="$m1" -v c="$mb" 'BEGIN { printf "  ratio strata / HF: %.2fx (per text), %.2fx (batch)\n", a / b, a / c }'
echo "  texts whose ids differ from HF: $differ of $texts"
