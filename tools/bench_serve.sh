#!/usr/bin/env bash
# `./strata bench serve`: Strata's OpenAI server next to llama.cpp's llama-server on the same
# weights, same threads, one run (tools/bench_serve.py drives both over HTTP):
#   1. a 6-turn chat, each turn adding ~270 tokens and keeping the answers: time to first
#      token per turn, with prefix reuse (Strata default; llama-server cache_prompt) and cold
#      (Strata --no-prefix-cache; llama-server cache_prompt false);
#   2. bursts of 16 and 64 concurrent requests (max_tokens 32) at --max-batch 8 / --parallel 8;
#   3. KV bytes per cached token and 4k-token conversations per 4 GiB.
# Strata runs 1 stage (BENCH_THREADS threads) and 2 stages (1 thread each), KV f16. The
# checkpoint is bench peers' Qwen3-0.6B-shaped random bf16 model ($PEERS_DIR) with the Qwen3
# tokenizer beside it (STRATA_TOKENIZER_DIR); llama-server reads its BF16 GGUF. llama-server:
# $LLAMA_SERVER, or the one built from the pinned llama-cpp-python sdist's llama.cpp under
# ~/.cache/strata/llama-src (cmake --target llama-server); without it the table has Strata's
# rows only and says so. A benchmark, not a test: nothing is asserted.
# Env: BENCH_THREADS (2), BENCH_TURNS (6), BENCH_WORDS (200 words ~ 270 tokens), BENCH_BURSTS
# ("16 64"), PEERS_DIR, STRATA_TOKENIZER_DIR, LLAMA_SERVER, STRATA_BAZEL_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${BENCH_THREADS:-2}
turns=${BENCH_TURNS:-6}
words=${BENCH_WORDS:-200}
bursts=${BENCH_BURSTS:-16 64}
dir=${PEERS_DIR:-$HOME/.cache/strata/peers-model}
tok=${STRATA_TOKENIZER_DIR:-$(pwd)/../shared/data/qwen3-tokenizer}
src=$HOME/.cache/strata/llama-src
llama=${LLAMA_SERVER:-$(ls "$src"/*/vendor/llama.cpp/build/bin/llama-server 2>/dev/null | head -1)}
log() { printf 'bench serve: %s\n' "$*" >&2; }

bazel build ${STRATA_BAZEL_FLAGS:-} //runtime:strata-stage //runtime:strata-serve \
    //reference/tools:strata-bench-decode >/dev/null 2>&1 ||
    { bazel build ${STRATA_BAZEL_FLAGS:-} //runtime:strata-stage //runtime:strata-serve //reference/tools:strata-bench-decode; exit 1; }
STRATA_BIN_DIR=$(bazel info ${STRATA_BAZEL_FLAGS:-} bazel-bin 2>/dev/null)
export STRATA_BIN_DIR

mkdir -p "$dir"
if ! [ -f "$dir/model.safetensors" ]; then
    log "writing the Qwen3-0.6B-shaped checkpoint to $dir"
    kept=$(TMPDIR="$dir" "$STRATA_BIN_DIR/reference/tools/strata-bench-decode" --keep --threads 1 \
        --steps 1 --repeat 1 | sed -n 's/^checkpoint kept at //p')
    mv "$kept/config.json" "$kept/model.safetensors" "$dir/" && rmdir "$kept"
fi
[ -f "$tok/tokenizer.json" ] || { log "no tokenizer.json in $tok (set STRATA_TOKENIZER_DIR)"; exit 1; }
model=$(mktemp -d)
results=$(mktemp)
work=$(mktemp -d)
pids=""
cleanup() {
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$model" "$work"
    rm -f "$results"
}
trap cleanup EXIT
ln -s "$dir/config.json" "$dir/model.safetensors" "$tok/tokenizer.json" \
    "$tok/tokenizer_config.json" "$model/"

# engine NAME URL [cold]: the chat, then the bursts, each line into $results.
measure() {
    python3 tools/bench_serve.py chat "$2" model "$turns" "$words" "$1" ${3:-} | tee -a "$results" >&2
    [ -n "${3:-}" ] && return 0
    for n in $bursts; do
        python3 tools/bench_serve.py burst "$2" model "$n" "$1" | tee -a "$results" >&2
    done
}

# strata NAME STAGES THREADS [strata-serve flags]: one server, measured, stopped.
strata() {
    local name=$1 stages=$2 t=$3
    shift 3
    setsid tools/strata_serve.sh --model "$model" --stages "$stages" --port 0 \
        --port-file "$work/$name.port" --max-seq 4096 --max-batch 8 --max-queue 256 \
        --threads "$t" --kv-dtype f16 --served-model-name model "$@" >"$work/$name.log" 2>&1 &
    local pid=$!
    pids="$pids $pid"
    for _ in $(seq 600); do [ -s "$work/$name.port" ] && break; sleep 0.2; done
    [ -s "$work/$name.port" ] || { log "$name did not start: $(tail -5 "$work/$name.log")"; exit 1; }
    log "$name on port $(cat "$work/$name.port")"
    if [ "${1:-}" = --no-prefix-cache ]; then
        measure "$name" "http://127.0.0.1:$(cat "$work/$name.port")" cold
    else
        measure "$name" "http://127.0.0.1:$(cat "$work/$name.port")"
    fi
    kill -TERM -- "-$pid" 2>/dev/null || kill "$pid"
    wait "$pid" 2>/dev/null || true
}

strata "strata 1 stage" 1 "$threads"
strata "strata 1 stage, no cache" 1 "$threads" --no-prefix-cache
strata "strata 2 stages" 2 1

if [ -n "$llama" ] && [ -x "$llama" ]; then
    gguf="$dir/model-bf16.gguf"
    if ! [ -f "$gguf" ]; then
        venv=$HOME/.cache/strata/serve-venv
        [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
        "$venv/bin/python" -c 'import gguf, numpy' 2>/dev/null ||
            "$venv/bin/python" -m pip install -q gguf==0.19.0 numpy==2.1.3 >&2
        log "converting to GGUF bf16"
        "$venv/bin/python" tools/bench_peers.py gguf "$dir" "$gguf.part" bf16 "$tok"
        mv "$gguf.part" "$gguf"
    fi
    port=$((20000 + RANDOM % 10000))
    "$llama" -m "$gguf" -t "$threads" --parallel 8 -c $((8 * 4096)) --host 127.0.0.1 \
        --port "$port" >"$work/llama.log" 2>&1 &
    lpid=$!
    pids="$pids $lpid"
    for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.2; done
    measure "llama-server" "http://127.0.0.1:$port"
    python3 tools/bench_serve.py chat "http://127.0.0.1:$port" model "$turns" "$words" \
        "llama-server, no cache" cold | tee -a "$results" >&2
    kill "$lpid" 2>/dev/null || true
else
    log "no llama-server binary (set LLAMA_SERVER, or build it: see the header of this script): Strata's rows only"
fi

python3 - "$dir/config.json" >>"$results" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
D = c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
per = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * D
print(json.dumps({"kind": "kv", "engine": "-", "f32_bytes": per * 4, "f16_bytes": per * 2,
                  "f32_convs": (4 << 30) // (per * 4 * 4096), "f16_convs": (4 << 30) // (per * 2 * 4096)}))
PY
echo "bench serve: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), threads $threads"
python3 tools/bench_serve.py table "$results"
