#!/bin/bash
# Damaged model directories against the real binaries: copies of golden checkpoints with a
# truncated or malformed model.safetensors, or a hostile config.json, given to strata-stage,
# strata-plan and strata-sim. Every run must end within a bound (a timeout is a hang), exit
# nonzero by itself (128 and above is a crash: a signal) and say on stderr what is wrong
# (a keyword per case: the file, the field or the tensor).
#
# usage: model_dir_attack_test.sh STAGE PLAN SIM GOLDEN_DENSE GOLDEN_MOE
set -u
export LC_ALL=C # byte lengths (${#hdr}) and byte-wise sed
stage_bin="$1"
plan_bin="$2"
sim_bin="$3"
dense="$4"
moe="$5"
for b in "$stage_bin" "$plan_bin" "$sim_bin"; do
    [ -x "$b" ] || { echo "FAIL: $b is not executable"; exit 1; }
done

work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/model_dir_attack.XXXXXX")"
trap 'rm -rf "$work"' EXIT

cases=0 crashes=0 hangs=0 fails=0

# fresh SRC: a writable copy of golden directory SRC; prints its path.
fresh() {
    local d
    d="$(mktemp -d "$work/m.XXXXXX")"
    cp "$1"/config.json "$1"/model.safetensors "$d"/
    [ -f "$1/golden.json" ] && cp "$1/golden.json" "$1/prompt_ids.json" "$d"/
    chmod -R u+w "$d"
    echo "$d"
}

# u64le N: N as 8 little-endian bytes (N up to 2^64 - 1, given in decimal).
u64le() {
    local v="$1" _ out=""
    for _ in 0 1 2 3 4 5 6 7; do
        out="$out$(printf '\\%03o' "$((v & 255))")"
        v=$((v >> 8))
        v=$((v & 0x00ffffffffffffff)) # bash shifts are arithmetic: keep it unsigned
    done
    # shellcheck disable=SC2059 # the format is the escapes built above
    printf "$out"
}

header_len() { od -An -tu8 -N8 "$1" | tr -d ' '; }
header_of() { dd if="$1" bs=4096 iflag=skip_bytes,count_bytes skip=8 count="$(header_len "$1")" 2>/dev/null; }

# rewrite_header FILE SED_EXPR: FILE with its JSON header edited by sed (the data section
# kept as is; offsets are relative to it, so a longer or shorter header moves nothing).
rewrite_header() {
    local f="$1" expr="$2" hl hdr
    hl="$(header_len "$f")"
    hdr="$(header_of "$f" | sed "$expr")"
    {
        u64le "${#hdr}"
        printf '%s' "$hdr"
        tail -c +"$((8 + hl + 1))" "$f"
    } >"$f.new"
    mv "$f.new" "$f"
}

# set_field CONFIG FIELD VALUE: replaces "FIELD": <value> in a pretty-printed config.json.
set_field() { sed -i "s/\"$2\": [^,]*\(,\?\)\$/\"$2\": $3\1/" "$1"; }
del_field() { sed -i "/\"$2\":/d" "$1"; }

# run_bin BIN DIR: runs strata-BIN on model directory DIR (stdout DIR.out, stderr DIR.err);
# returns its exit status (124: it ran past the bound; 137: it ignored SIGTERM too).
run_bin() {
    local bin="$1" dir="$2"
    case "$bin" in
    stage)
        timeout -k 5 20 "$stage_bin" --model "$dir" --num-stages 1 --stage-idx 0 --insecure \
            --port-file "$dir.port" --next-port-file "$dir.port" >"$dir.out" 2>"$dir.err" </dev/null
        ;;
    plan) timeout -k 5 20 "$plan_bin" --model "$dir" --stages 2 >"$dir.out" 2>"$dir.err" </dev/null ;;
    sim) timeout -k 5 20 "$sim_bin" --model "$dir" --stages 1 >"$dir.out" 2>"$dir.err" </dev/null ;;
    esac
}

# error_text BIN DIR: where the run said what is wrong. strata-stage and strata-plan print it
# on stderr ("strata-X: ..." first, or a per-tensor report); strata-sim prints a failed run
# in its results table on stdout (the ERROR row) and only usage and config errors on stderr.
# The copy's path becomes DIR before warnings are dropped: mktemp's random name may spell
# "warn" (m.XwarnO did once, and the error naming the file vanished with it).
error_text() {
    if [ "$1" = sim ]; then
        sed -n 's/^.* ERROR  *//p' "$2.out" | sed "s|$2|DIR|g"
    fi
    sed "s|$2|DIR|g" "$2.err" | grep -v -i -e '^\s*$' -e 'warn' -e '\] info:'
}

# run_case WHAT KEYWORD DIR BINARIES...: runs each binary on DIR and checks the outcome;
# KEYWORD is an extended regular expression (case-insensitive) the error must match.
run_case() {
    local what="$1" keyword="$2" dir="$3" bin rc first status
    shift 3
    for bin in "$@"; do
        cases=$((cases + 1))
        run_bin "$bin" "$dir"
        rc=$?
        # error_text shortens the copy's path to DIR so the line shows the message.
        first="$(error_text "$bin" "$dir" | head -n 1 | cut -c1-240)"
        status=""
        if [ "$rc" -eq 124 ]; then
            status="HANG"
            hangs=$((hangs + 1))
        elif [ "$rc" -ge 128 ]; then
            status="CRASH"
            crashes=$((crashes + 1))
        elif [ "$rc" -eq 0 ]; then
            status="FAIL (exit 0)"
            fails=$((fails + 1))
        elif ! error_text "$bin" "$dir" | grep -qiE -- "$keyword"; then
            status="FAIL (error lacks /$keyword/)"
            fails=$((fails + 1))
        fi
        echo "case: $what | strata-$bin exit $rc | ${first:-<no error text>}${status:+ | $status}"
        if [ -n "$status" ]; then
            tail -n 5 "$dir.err" | sed 's/^/    stderr: /'
            tail -n 3 "$dir.out" | sed 's/^/    stdout: /'
        fi
    done
}

# The intact golden copies work with these command lines (so a damaged case fails because
# of the damage): strata-plan and strata-sim exit 0, strata-stage loads and listens.
control() {
    local d rc
    d="$(fresh "$1")"
    for bin in plan sim; do
        run_bin "$bin" "$d"
        rc=$?
        if [ "$rc" -ne 0 ]; then
            echo "FAIL control: strata-$bin exit $rc on intact $(basename "$1")"
            cat "$d.err"
            exit 1
        fi
    done
    "$stage_bin" --model "$d" --num-stages 1 --stage-idx 0 --insecure --port-file "$d.port" \
        --next-port-file "$d.port" >"$d.out" 2>"$d.err" </dev/null &
    local pid=$!
    for _ in $(seq 100); do
        [ -s "$d.port" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    if [ ! -s "$d.port" ]; then
        echo "FAIL control: strata-stage did not start on intact $(basename "$1")"
        cat "$d.err"
        exit 1
    fi
    echo "control: intact $(basename "$1") | strata-plan, strata-sim exit 0, strata-stage listens"
}
control "$dense"
control "$moe"

ST=model.safetensors
ALL=(stage plan sim)

# ---- model.safetensors truncated ----
size="$(wc -c <"$dense/$ST")" # runfiles are links: measure the target
hl="$(header_len "$dense/$ST")"
trunc() { # WHAT KEYWORD LENGTH
    local d
    d="$(fresh "$dense")"
    truncate -s "$3" "$d/$ST"
    run_case "$ST truncated: $1 ($3 bytes)" "$2" "$d" "${ALL[@]}"
}
trunc "empty" "$ST" 0
trunc "4 bytes" "$ST" 4
trunc "8 bytes (header length only)" "header length" 8
trunc "mid-header" "header length" $((8 + hl / 2))
trunc "right after the header" "data_offsets" $((8 + hl))
trunc "mid-data" "data_offsets" $(((8 + hl + size) / 2))
trunc "one byte short" "data_offsets" $((size - 1))

# ---- malformed header ----
d="$(fresh "$dense")"
{ u64le $((size)); tail -c +9 "$dense/$ST"; } >"$d/$ST"
run_case "header length larger than the file" "header length" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
{ u64le 9223372036854775808; tail -c +9 "$dense/$ST"; } >"$d/$ST"
run_case "header length 2^63" "header length" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
{ u64le 18446744073709551615; tail -c +9 "$dense/$ST"; } >"$d/$ST"
run_case "header length 2^64-1" "header length" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rewrite_header "$d/$ST" 's/^{"__metadata__"/<"__metadata__"/'
run_case "header not JSON" "JSON" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rewrite_header "$d/$ST" 's/^.*$/[1, 2, 3]/'
run_case "header a JSON list" "JSON object" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rewrite_header "$d/$ST" 's/^.*$/{}/'
run_case "header an empty object" "model.embed_tokens.weight" "$d" "${ALL[@]}"

E='"model\.embed_tokens\.weight":{"dtype":"BF16","shape":\[512,64\],"data_offsets":\[0,65536\]}'
d="$(fresh "$dense")"
rewrite_header "$d/$ST" "s/$E/\"model.embed_tokens.weight\":{\"dtype\":\"BF17\",\"shape\":[512,64],\"data_offsets\":[0,65536]}/"
run_case "unknown dtype" "dtype" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rewrite_header "$d/$ST" "s/$E/\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[512,64],\"data_offsets\":[0,65536]}/"
run_case "dtype F32 for BF16 bytes" "model.embed_tokens.weight" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rewrite_header "$d/$ST" "s/$E/\"model.embed_tokens.weight\":{\"dtype\":\"I32\",\"shape\":[256,64],\"data_offsets\":[0,65536]}/"
run_case "integer dtype I32" "model.embed_tokens.weight" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rewrite_header "$d/$ST" "s/$E/\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[64,512],\"data_offsets\":[0,65536]}/"
run_case "shape transposed" "model.embed_tokens.weight" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rewrite_header "$d/$ST" "s/$E/\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[512,63],\"data_offsets\":[0,65536]}/"
run_case "shape not matching the bytes" "model.embed_tokens.weight" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rewrite_header "$d/$ST" "s/$E/\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[512,64,1,-1],\"data_offsets\":[0,65536]}/"
run_case "negative dimension" "model.embed_tokens.weight" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rewrite_header "$d/$ST" "s/$E/\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,65536]}/"
run_case "shape overflowing" "model.embed_tokens.weight" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rewrite_header "$d/$ST" "s/$E/\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[512,64],\"data_offsets\":[9000000000,9000065536]}/"
run_case "data_offsets out of range" "data_offsets" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rewrite_header "$d/$ST" "s/$E/\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[512,64],\"data_offsets\":[65536,0]}/"
run_case "data_offsets reversed" "data_offsets" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rewrite_header "$d/$ST" 's/"data_offsets":\[65536,65664\]/"data_offsets":[65408,65536]/'
run_case "data_offsets overlapping" "overlap" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rewrite_header "$d/$ST" 's/"model\.layers\.0\.mlp\.up_proj\.weight":{[^}]*},//'
run_case "tensor missing" "model.layers.0.mlp.up_proj.weight" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rewrite_header "$d/$ST" 's/"model\.layers\.0\.mlp\.up_proj\.weight"/"model.layers.0.input_layernorm.weight"/'
run_case "tensor defined twice" "defined twice" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rm "$d/$ST"
# strata-plan plans from config.json alone when there are no weights (sizes estimated).
run_case "$ST absent" "$ST" "$d" stage sim

d="$(fresh "$dense")"
rm "$d/$ST"
mkdir "$d/$ST"
run_case "$ST a directory" "$ST.*not a regular file" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rm "$d/$ST"
mkfifo "$d/$ST"
run_case "$ST a FIFO" "$ST.*not a regular file" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rm "$d/$ST"
ln -s /dev/zero "$d/$ST"
run_case "$ST a link to /dev/zero" "$ST.*not a regular file" "$d" "${ALL[@]}"

# A header length past the 100 MiB limit in a (sparse) file long enough to hold it.
d="$(fresh "$dense")"
{ u64le $((200 << 20)); tail -c +9 "$dense/$ST"; } >"$d/$ST"
truncate -s $((300 << 20)) "$d/$ST"
run_case "header length 200 MiB" "header length" "$d" "${ALL[@]}"

# ---- sharded checkpoints: model.safetensors.index.json ----
IX=model.safetensors.index.json
d="$(fresh "$dense")"
printf 'not json' >"$d/$IX"
run_case "$IX not JSON" "$IX" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
printf '{"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}' >"$d/$IX"
run_case "$IX names an absent shard" "model-00001-of-00002" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
printf '{"weight_map": {"model.norm.weight": "../%s"}}' "$(basename "$d")/$ST" >"$d/$IX"
run_case "$IX names a shard outside the directory" "same directory" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
printf '{"weight_map": {"model.norm.weight": "%s", "lm_head.weight": "%s"}}' "$ST" "$ST" >"$d/$IX"
run_case "$IX lists a tensor the shard lacks" "lm_head.weight" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rm "$d/$ST"
mkfifo "$d/$IX"
run_case "$IX a FIFO" "$IX.*not a regular file" "$d" "${ALL[@]}"

# ---- config.json ----
CF=config.json
cfg_case() { # WHAT KEYWORD GOLDEN EDIT...
    local what="$1" keyword="$2" src="$3" d
    shift 3
    d="$(fresh "$src")"
    "$@" "$d/$CF"
    run_case "$CF $what" "$keyword" "$d" "${ALL[@]}"
}
sf() { set_field "$3" "$1" "$2"; }                  # sf FIELD VALUE FILE
df() { del_field "$2" "$1"; }                       # df FIELD FILE
put() { printf '%s' "$1" >"$2"; }                   # put TEXT FILE

for src in "$dense" "$moe"; do
    tag="$(basename "$src")"
    cfg_case "($tag) num_hidden_layers 0" num_hidden_layers "$src" sf num_hidden_layers 0
    cfg_case "($tag) num_hidden_layers -1" num_hidden_layers "$src" sf num_hidden_layers -1
    cfg_case "($tag) num_hidden_layers 1000000000" num_hidden_layers "$src" sf num_hidden_layers 1000000000
    cfg_case "($tag) num_hidden_layers 8 (more than stored)" "model.layers.4" "$src" sf num_hidden_layers 8
    cfg_case "($tag) hidden_size 0" hidden_size "$src" sf hidden_size 0
    cfg_case "($tag) hidden_size -64" hidden_size "$src" sf hidden_size -64
    cfg_case "($tag) hidden_size 1e30" hidden_size "$src" sf hidden_size 1e30
    cfg_case "($tag) hidden_size 1048576 (in range, not the weights)" "model.embed_tokens.weight" "$src" sf hidden_size 1048576
    cfg_case "($tag) vocab_size 1073741824" "model.embed_tokens.weight" "$src" sf vocab_size 1073741824
    cfg_case "($tag) intermediate_size 16777216" "mlp\.(gate|up|down)_proj" "$src" sf intermediate_size 16777216
    cfg_case "($tag) num_attention_heads 0" num_attention_heads "$src" sf num_attention_heads 0
    cfg_case "($tag) num_attention_heads 65536" "q_proj" "$src" sf num_attention_heads 65536
    cfg_case "($tag) num_key_value_heads 3" num_key_value_heads "$src" sf num_key_value_heads 3
    cfg_case "($tag) head_dim 65536" "head_dim|self_attn" "$src" sf head_dim 65536
    cfg_case "($tag) hidden_size missing" hidden_size "$src" df hidden_size
    cfg_case "($tag) num_hidden_layers missing" num_hidden_layers "$src" df num_hidden_layers
    cfg_case "($tag) model_type missing" model_type "$src" df model_type
    cfg_case "($tag) hidden_size a string" hidden_size "$src" sf hidden_size '"64"'
    cfg_case "($tag) num_hidden_layers 2.5" num_hidden_layers "$src" sf num_hidden_layers 2.5
    cfg_case "($tag) model_type a number" model_type "$src" sf model_type 3
    cfg_case "($tag) model_type llama" model_type "$src" sf model_type '"llama"'
    cfg_case "($tag) rms_norm_eps negative" rms_norm_eps "$src" sf rms_norm_eps -1
    cfg_case "($tag) not JSON" "$CF" "$src" put 'this is not json'
    cfg_case "($tag) a JSON list" "$CF" "$src" put '[1, 2]'
    cfg_case "($tag) empty file" "$CF" "$src" put ''
done
cfg_case "(qwen3_moe) num_experts 0" num_experts "$moe" sf num_experts 0
cfg_case "(qwen3_moe) num_experts missing" num_experts "$moe" df num_experts
cfg_case "(qwen3_moe) num_experts 65536" "experts" "$moe" sf num_experts 65536
cfg_case "(qwen3_moe) num_experts_per_tok 0" num_experts_per_tok "$moe" sf num_experts_per_tok 0
cfg_case "(qwen3_moe) num_experts_per_tok 1000" num_experts_per_tok "$moe" sf num_experts_per_tok 1000
cfg_case "(qwen3_moe) moe_intermediate_size 0" moe_intermediate_size "$moe" sf moe_intermediate_size 0
cfg_case "(qwen3_moe) moe_intermediate_size 16777216" "experts" "$moe" sf moe_intermediate_size 16777216
cfg_case "(qwen3_moe) decoder_sparse_step 0" decoder_sparse_step "$moe" sf decoder_sparse_step 0
# mlp_only_layers is a multi-line list: replace the whole block.
mlp_only() { sed -i "/\"mlp_only_layers\"/,/\]/c\\  \"mlp_only_layers\": $1," "$2"; }
cfg_case "(qwen3_moe) mlp_only_layers [99]" mlp_only_layers "$moe" mlp_only '[99]'
cfg_case "(qwen3_moe) mlp_only_layers [-1]" mlp_only_layers "$moe" mlp_only '[-1]'
cfg_case "(qwen3_moe) mlp_only_layers a string" mlp_only_layers "$moe" mlp_only '"3"'
# Enough experts and layers that one expert tensor list would take tens of GB.
cfg_case "(qwen3_moe) num_experts 65536 in 1024 layers" "num_experts" "$moe" \
    sed -i 's/"num_experts": 8,/"num_experts": 65536,/; s/"num_hidden_layers": 4,/"num_hidden_layers": 1024,/; s/"decoder_sparse_step": 2,/"decoder_sparse_step": 1,/'
d="$(fresh "$moe")"
rm "$d/$ST"
sed -i 's/"num_experts": 8,/"num_experts": 65536,/; s/"num_hidden_layers": 4,/"num_hidden_layers": 1024,/; s/"decoder_sparse_step": 2,/"decoder_sparse_step": 1,/' "$d/$CF"
run_case "$CF (qwen3_moe) num_experts 65536 in 1024 layers, no weights" "num_experts" "$d" plan

d="$(fresh "$dense")"
rm "$d/$CF"
run_case "$CF absent" "$CF" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rm "$d/$CF"
mkdir "$d/$CF"
run_case "$CF a directory" "$CF.*not a regular file" "$d" "${ALL[@]}"

d="$(fresh "$dense")"
rm "$d/$CF"
mkfifo "$d/$CF"
run_case "$CF a FIFO" "$CF.*not a regular file" "$d" "${ALL[@]}"

# The JSON followed by 100 MiB of NUL bytes (sparse): NULs read as trailing whitespace.
d="$(fresh "$dense")"
truncate -s $((100 << 20)) "$d/$CF"
run_case "$CF 100 MiB (sparse)" "$CF.*MiB" "$d" "${ALL[@]}"

echo "model dirs: $cases cases, $crashes crashes, $hangs hangs"
if [ "$crashes" -ne 0 ] || [ "$hangs" -ne 0 ] || [ "$fails" -ne 0 ]; then
    echo "FAIL: $crashes crashes, $hangs hangs, $fails other failures"
    exit 1
fi
