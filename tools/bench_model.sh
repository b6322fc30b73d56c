# shellcheck shell=bash
# Sourced by tools/bench_tp.sh and tools/bench_kvp.sh: bench_model DIR BIN_DIR makes sure DIR
# holds strata-bench-decode's Qwen3-0.6B-shaped random bf16 checkpoint (hidden 1024, 28
# layers, 16 q / 8 kv heads, head_dim 128, intermediate 3072, vocab 151936, tied), writing it
# once (~1.2 GB; `./strata bench peers` keeps the same one in ~/.cache/strata/peers-model).
bench_model() {
    local dir=$1 bin=$2 kept
    [ -f "$dir/model.safetensors" ] && return 0
    mkdir -p "$dir" || return 1
    echo "writing the Qwen3-0.6B-shaped checkpoint to $dir" >&2
    kept=$(TMPDIR="$dir" "$bin/reference/tools/strata-bench-decode" --keep --threads 1 \
        --steps 1 --repeat 1 | sed -n 's/^checkpoint kept at //p')
    [ -n "$kept" ] && mv "$kept/config.json" "$kept/model.safetensors" "$dir/" && rmdir "$kept"
}

# bench_moe_model DIR BIN_DIR: makes sure DIR holds strata-bench-backend's qwen3-moe-small
# random bf16 checkpoint (~2.9 GB; `./strata bench tp --moe`), writing it once; the writer
# takes the parent directory and names the checkpoint after the shape.
bench_moe_model() {
    local dir=$1 bin=$2
    [ -f "$dir/model.safetensors" ] && return 0
    [ "$(basename "$dir")" = qwen3-moe-small ] || { echo "MOE_DIR must end in /qwen3-moe-small" >&2; return 1; }
    mkdir -p "$(dirname "$dir")" || return 1
    "$bin/runtime/strata-bench-backend" --device cpu --shapes qwen3-moe-small --batch 1 --steps 1 \
        --prefill 0 --context 1 --threads 1 --dir "$(dirname "$dir")" --keep >/dev/null
}
