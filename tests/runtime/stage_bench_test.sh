#!/bin/bash
# strata-stage-bench's helpers that other tests and benchmarks lean on:
#   make-draft: a draft of a golden's first layers has that many layers in its config, the
#     target's tensors for them (byte for byte: the safetensors data of the kept tensors is
#     the target's, in its order), none of the later layers'; refusals are clear;
#   ngram-text: a repeating text and an edit that copies its prompt are drafted well (many
#     tokens per step), a draft of one token per step stays at most 2; bad files and usage are
#     clear errors with their exit codes (1, 2).
# usage: stage_bench_test.sh STAGE_BENCH TOKENIZER_DIR GOLDEN_DENSE
set -u
bench="$1"
tok="$2"
golden="$3"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/stage_bench.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail=0
die() { echo "FAIL: $*"; fail=1; }

# ---- make-draft
"$bench" make-draft --from "$golden" --layers 2 --out "$work/d2" >"$work/d2.out" 2>&1 ||
    die "make-draft failed: $(cat "$work/d2.out")"
grep -q '"num_hidden_layers":.2,' "$work/d2/config.json" || die "draft config: not 2 layers"
hdr() { # the JSON header of a safetensors file
    local n
    n=$(od -An -tu8 -N8 "$1" | tr -d ' ')
    dd if="$1" bs=1 skip=8 count="$n" 2>/dev/null
}
hdr "$work/d2/model.safetensors" >"$work/d2.hdr"
grep -q '"model.layers.1.mlp.down_proj.weight"' "$work/d2.hdr" || die "draft lacks layer 1"
grep -q '"model.layers.2\.' "$work/d2.hdr" && die "draft has layer 2"
grep -q '"model.embed_tokens.weight"' "$work/d2.hdr" || die "draft lacks the embedding"
grep -q '"model.norm.weight"' "$work/d2.hdr" || die "draft lacks the final norm"
# The target's bytes: its first tensors (the embedding, then layer 0 ..) in the same order, so
# the draft's data section is a prefix of the target's up to the first later-layer tensor...
# checked here on the embedding, the first tensor of both.
tn=$(od -An -tu8 -N8 "$golden/model.safetensors" | tr -d ' ')
dn=$(od -An -tu8 -N8 "$work/d2/model.safetensors" | tr -d ' ')
emb=$(hdr "$golden/model.safetensors" | grep -o '"model.embed_tokens.weight":{[^}]*}' |
    sed 's/.*"data_offsets":\[\([0-9]*\),\([0-9]*\)\].*/\1 \2/')
read -r e0 e1 <<<"$emb"
cmp -s <(tail -c +$((8 + tn + e0 + 1)) "$golden/model.safetensors" | head -c $((e1 - e0))) \
    <(tail -c +$((8 + dn + 1)) "$work/d2/model.safetensors" | head -c $((e1 - e0))) ||
    die "the draft's embedding bytes differ from the target's"
"$bench" make-draft --from "$golden" --layers 4 --out "$work/d4" >"$work/d4.out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "fewer than" "$work/d4.out" || die "--layers = the model's: exit $rc, $(cat "$work/d4.out")"
"$bench" make-draft --from "$work/absent" --layers 1 --out "$work/x" >"$work/x.out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "absent" "$work/x.out" || die "absent model: exit $rc, $(cat "$work/x.out")"
"$bench" make-draft --from "$golden" --out "$work/x" >/dev/null 2>&1
[ $? -eq 2 ] || die "make-draft without --layers is not a usage error"

# ---- ngram-text
for i in $(seq 60); do printf 'alpha beta gamma delta '; done >"$work/loop.txt"
for i in $(seq 200); do printf 'line %d: value = compute(%d, "item%d");\n' "$i" $((i * 7)) "$i"; done >"$work/old.c"
sed 's/compute(/compute_fast(/' "$work/old.c" >"$work/new.c" # an edit of every line
tps() { awk -v f="$1" '$1 == f { print $NF }' "$2"; }
"$bench" ngram-text --tokenizer "$tok" "$work/loop.txt" "$work/old.c:$work/new.c" >"$work/ng.out" 2>&1 ||
    die "ngram-text failed: $(cat "$work/ng.out")"
cat "$work/ng.out"
loop=$(tps loop.txt "$work/ng.out")
edit=$(tps old.c:new.c "$work/ng.out")
awk -v t="$loop" 'BEGIN { exit !(t >= 4) }' || die "a repeating text: $loop tokens per step (want >= 4)"
awk -v t="$edit" 'BEGIN { exit !(t >= 2) }' || die "an edit: $edit tokens per step (want >= 2)"
"$bench" ngram-text --tokenizer "$tok" --k 1 "$work/loop.txt" >"$work/k1.out" 2>&1 || die "k 1 failed"
k1=$(tps loop.txt "$work/k1.out")
awk -v t="$k1" 'BEGIN { exit !(t > 1.5 && t <= 2) }' || die "k 1: $k1 tokens per step (want (1.5, 2])"
"$bench" ngram-text --tokenizer "$tok" "$work/absent.txt" >"$work/a.out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "absent.txt" "$work/a.out" || die "absent file: exit $rc, $(cat "$work/a.out")"
"$bench" ngram-text "$work/loop.txt" >/dev/null 2>&1
[ $? -eq 2 ] || die "ngram-text without --tokenizer is not a usage error"
"$bench" ngram-text --tokenizer "$tok" --k 17 "$work/loop.txt" >/dev/null 2>&1
[ $? -eq 2 ] || die "--k 17 is not a usage error"
[ $fail -eq 0 ] && echo PASS
exit $fail
