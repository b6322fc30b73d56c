#!/bin/bash
# strata-stage-bench's helpers that other tests and benchmarks lean on:
#   make-draft: a draft of a golden's first layers has that many layers in its config, the
#     target's tensors for them (byte for byte: the safetensors data of the kept tensors is
#     the target's, in its order), none of the later layers'; refusals are clear;
#   ngram-text: a repeating text and an edit that copies its prompt are drafted well (many
#     tokens per step), a draft of one token per step stays at most 2; bad files and usage are
#     clear errors with their exit codes (1, 2);
#   probe-link: a listener and a prober on loopback, plaintext and over TLS 1.3 PSK, give a
#     "link" object with a latency and a bandwidth (the echo of every size checked by the
#     prober); a wrong key, a closed port and bad options fail clearly.
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
# ---- probe-link
# listen NAME [OPTS]: a listener for one prober, its port in $work/NAME.port.
listen() {
    local name=$1
    shift
    "$bench" probe-link --listen --once --port-file "$work/$name.port" "$@" 2>"$work/$name.listen" &
    for _ in $(seq 50); do [ -s "$work/$name.port" ] && break; sleep 0.1; done
    [ -s "$work/$name.port" ] || die "$name: the listener did not start: $(cat "$work/$name.listen")"
}
probe() { # NAME [OPTS]: probes NAME's listener; exit status in $rc
    local name=$1
    shift
    "$bench" probe-link --connect "127.0.0.1:$(cat "$work/$name.port")" --rows 1,64 \
        --seconds 0.2 --out "$work/$name.json" "$@" >"$work/$name.out" 2>&1
    rc=$?
}
check_link() { # NAME: the written link object has a latency >= 0 and a bandwidth > 0
    grep -Eq '^\{"latency_us": [0-9.]+, "gbps": [0-9.]*[1-9][0-9.]*, "source": "measured' "$work/$1.json" ||
        die "$1: no link object: $(cat "$work/$1.out")"
}
listen plain
probe plain
wait
[ $rc -eq 0 ] || die "plaintext probe: exit $rc: $(cat "$work/plain.out")"
check_link plain
grep -q "frames echoed" "$work/plain.listen" || die "the listener did not report its echoes"
head -n 4 "$work/plain.out"
printf 'a-pre-shared-key-of-32-bytes-ok!' >"$work/key"
printf 'another-key-of-32-bytes-not-it!!' >"$work/wrong"
listen psk --auth-key-file "$work/key"
probe psk --auth-key-file "$work/key"
wait
[ $rc -eq 0 ] || die "PSK probe: exit $rc: $(cat "$work/psk.out")"
check_link psk
grep -q "over TLS 1.3 (PSK)" "$work/psk.out" || die "the PSK probe does not say TLS"
listen wrong --auth-key-file "$work/key"
probe wrong --auth-key-file "$work/wrong"
wait
[ $rc -eq 1 ] || die "a wrong key: exit $rc, want 1: $(cat "$work/wrong.out")"
port=$(cat "$work/plain.port") # that listener is gone: nothing listens there now
"$bench" probe-link --connect "127.0.0.1:$port" >"$work/closed.out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "probe-link:" "$work/closed.out" || die "a closed port: exit $rc: $(cat "$work/closed.out")"
for bad in "--listen --connect 127.0.0.1:1" "--connect nohostport" "--connect 127.0.0.1:1 --rows 5" \
    "--connect 127.0.0.1:1 --hidden 0" "--listen --bogus 1" "--connect a\"b:1" ""; do
    # shellcheck disable=SC2086 # the options are words
    "$bench" probe-link $bad >/dev/null 2>&1
    rc=$?
    [ $rc -eq 2 ] || die "probe-link $bad: exit $rc, want 2"
done

[ $fail -eq 0 ] && echo PASS
exit $fail
