#!/usr/bin/env bash
# `./strata bench peers`: decode tokens/s of Strata's CPU reference decoder (bf16, and
# --weights-dtype q8) next to llama.cpp (llama-cpp-python, BF16 and Q8_0 GGUF of the same
# weights) at 1 and 2 threads, with the read-bandwidth roofline. A benchmark, not a test:
# nothing is asserted.
#
# - The checkpoint is strata-bench-decode's Qwen3-0.6B-shaped random bf16 model, written once
#   to $PEERS_DIR (default ~/.cache/strata/peers-model) and converted to GGUF there by
#   tools/bench_peers.py (the `gguf` package; a Qwen3 tokenizer.json is needed only for the
#   GGUF vocabulary: STRATA_TOKENIZER_DIR, default ../shared/data/qwen3-tokenizer beside the
#   checkout).
# - Runs are interleaved (strata bf16, strata q8, llama bf16, llama q8_0 at 1 thread, then at
#   2, repeated BENCH_REPEAT times, default 3) and medians are printed, since the host may be
#   shared; the 1-minute load average before each run is recorded and its median printed.
# - Roofline: a streaming sum over 1 GiB at the same thread count (strata-bench-decode's read
#   bandwidth) divided by the weight bytes read per token (bf16 rows: the bf16 bytes; q8 rows:
#   Strata's q8 bytes, f32 scales, ~6% more than Q8_0's f16 scales).
# - Greedy-token agreement: strata-generate bf16 / q8 and llama.cpp BF16 / Q8_0 from the same
#   prompt ids, free-running and teacher-forced (llama.cpp reads Strata's ids; its argmax and
#   logits are compared position by position: a random model's near-ties end the free run's
#   agreement at the first one).
# Env: BENCH_REPEAT, BENCH_STEPS (64), BENCH_PROMPT (64: its prefill is timed too), BENCH_THREADS ("1 2"), PEERS_DIR,
# STRATA_PEERS_VENV, STRATA_TOKENIZER_DIR, STRATA_BAZEL_FLAGS, CMAKE_ARGS (llama.cpp build).
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=${BENCH_REPEAT:-3}
steps=${BENCH_STEPS:-64}
prompt=${BENCH_PROMPT:-64}
threads=${BENCH_THREADS:-1 2}
dir=${PEERS_DIR:-$HOME/.cache/strata/peers-model}
venv=${STRATA_PEERS_VENV:-$HOME/.cache/strata/peers-venv}
tok=${STRATA_TOKENIZER_DIR:-$(pwd)/../shared/data/qwen3-tokenizer}
py="$venv/bin/python"
log() { printf 'bench peers: %s\n' "$*" >&2; }

if ! [ -x "$py" ] || ! "$py" -c 'import llama_cpp, gguf, numpy' 2>/dev/null; then
    log "installing tools/requirements-peers.txt into $venv (llama.cpp compiles from source: slow)"
    [ -x "$py" ] || python3 -m venv "$venv"
    # Only the library is needed: no tests, examples, tools, server or multimodal helper.
    CMAKE_ARGS=${CMAKE_ARGS:-"-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DLLAVA_BUILD=OFF"} \
        CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
        "$py" -m pip install -r tools/requirements-peers.txt >&2
fi

bazel build ${STRATA_BAZEL_FLAGS:-} //reference/tools:strata-bench-decode \
    //reference/tools:strata-generate >/dev/null 2>&1 ||
    { bazel build ${STRATA_BAZEL_FLAGS:-} //reference/tools:strata-bench-decode //reference/tools:strata-generate; exit 1; }
bin="$(bazel info ${STRATA_BAZEL_FLAGS:-} bazel-bin 2>/dev/null)/reference/tools"

mkdir -p "$dir"
if ! [ -f "$dir/model.safetensors" ]; then
    log "writing the Qwen3-0.6B-shaped checkpoint to $dir"
    kept=$(TMPDIR="$dir" "$bin/strata-bench-decode" --keep --threads 1 --steps 1 --repeat 1 |
        sed -n 's/^checkpoint kept at //p')
    mv "$kept/config.json" "$kept/model.safetensors" "$dir/" && rmdir "$kept"
fi
for kind in bf16 q8_0; do
    if ! [ -f "$dir/model-$kind.gguf" ]; then
        [ -f "$tok/tokenizer.json" ] || { log "no tokenizer.json in $tok (set STRATA_TOKENIZER_DIR)"; exit 1; }
        log "converting to GGUF $kind"
        "$py" tools/bench_peers.py gguf "$dir" "$dir/model-$kind.gguf.part" "$kind" "$tok"
        mv "$dir/model-$kind.gguf.part" "$dir/model-$kind.gguf"
    fi
done

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for r in $(seq "$repeat"); do
    for t in $threads; do
        for wd in bf16 q8; do
            engine=strata
            [ "$wd" = q8 ] && engine=strata-q8
            load=$(cut -d' ' -f1 /proc/loadavg)
            line=$("$bin/strata-bench-decode" --model "$dir" --threads "$t" --steps "$steps" \
                --prompt "$prompt" --repeat 1 --weights-dtype "$wd" | awk -v t="$t" '$1 == t && NF >= 8')
            set -- $line
            printf '{"engine":"%s","threads":%s,"tok_s":%s,"mb_per_token":%s,"read_gbs":%s,"prefill_tok_s":%s,"prompt":%s,"load":%s}\n' \
                "$engine" "$t" "$2" "$3" "$7" "$9" "$prompt" "$load" >>"$results"
        done
        for kind in bf16 q8_0; do
            load=$(cut -d' ' -f1 /proc/loadavg)
            "$py" tools/bench_peers.py llama "$dir/model-$kind.gguf" "$t" "$prompt" "$steps" |
                "$py" -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps({"engine":"llama.cpp-'$kind'","threads":'$t',"tok_s":d["tok_s"],"prefill_tok_s":d["prefill_tok_s"],"load":'$load'}))' \
                >>"$results"
        done
        log "round $r/$repeat, $t thread(s) done"
    done
done
"$py" tools/bench_peers.py table "$results"

# Greedy agreement on the same prompt ids (random weights: near-ties make early divergence
# between two correct fp32-accumulating engines possible; llama.cpp rounds activations to bf16,
# and its Q8_0 has f16 scales where Strata's q8 has f32 ones).
# A 16-token prompt (BENCH_AGREE_PROMPT), whatever the timed prompt's length: the agreement
# line stays comparable between runs (with 64 ids this random model's first token is a near-tie).
agree=${BENCH_AGREE_PROMPT:-16}
ids=$("$py" -c "print(','.join(str((i*7919+13)%151936) for i in range($agree)))")
forced_out=$(mktemp)
trap 'rm -f "$results" "$forced_out"' EXIT
agreement() { # agreement STRATA_WEIGHTS_DTYPE GGUF_KIND
    local s_ids l_ids
    s_ids=$("$bin/strata-generate" --model "$dir" --prompt-ids "$ids" --max-tokens "$steps" \
        --ignore-eos --threads 2 --weights-dtype "$1" --out "$forced_out" 2>/dev/null | head -1)
    l_ids=$("$py" tools/bench_peers.py llama "$dir/model-$2.gguf" 2 "$agree" "$steps" |
        "$py" -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))')
    "$py" - "$s_ids" "$l_ids" "$1" "$2" <<'PYEOF'
import re, sys
a = [int(v) for v in re.findall(r"-?\d+", sys.argv[1])]
b = [int(v) for v in sys.argv[2].split(",")]
n = min(len(a), len(b))
prefix = next((i for i in range(n) if a[i] != b[i]), n)
same = sum(1 for i in range(n) if a[i] == b[i])
print("greedy agreement strata %s vs llama.cpp %s: first %d of %d ids identical (%d/%d positions equal)"
      % (sys.argv[3], sys.argv[4], prefix, n, same, n))
PYEOF
    printf '  '
    "$py" tools/bench_peers.py forced "$dir/model-$2.gguf" "$forced_out" "$ids"
}
agreement bf16 bf16
agreement q8 q8_0
