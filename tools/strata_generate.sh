#!/usr/bin/env bash
# Text in, text out on a local pipeline: starts an N-stage pipeline of strata-stage processes on
# loopback for a model directory (config.json + safetensors + tokenizer.json + chat template),
# sends one chat message (or, with --raw, raw text) through strata-client, streams the answer to
# stdout, then stops every stage. Usage on stderr. Binaries: $STRATA_BIN_DIR/runtime (./strata
# generate builds them and sets it), or Bazel runfiles under a test.
# Usage: tools/strata_generate.sh --model DIR [--stages N] [--max-tokens N] [--think]
#        [--system T] [--raw] [--max-seq N] [--print-ids] [--temperature T] [--seed S] MESSAGE
set -u
. "$(dirname "$0")/../tests/pipeline/pipeline_lib.sh"

gen_usage() {
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
}

model="" stages=1 max_tokens=128 max_seq="" mode=--chat message="" have_message=0
client_opts=()
while [ $# -gt 0 ]; do
    case "$1" in
    --model) model=$2; shift 2 ;;
    --stages) stages=$2; shift 2 ;;
    --max-tokens) max_tokens=$2; shift 2 ;;
    --max-seq) max_seq=$2; shift 2 ;;
    --system) client_opts+=(--system "$2"); shift 2 ;;
    --temperature | --seed | --top-p | --top-k) client_opts+=("$1" "$2"); shift 2 ;;
    --think | --print-ids) client_opts+=("$1"); shift ;;
    --raw) mode=--text; shift ;;
    -h | --help) gen_usage; exit 0 ;;
    --*) echo "strata generate: unknown option $1" >&2; gen_usage >&2; exit 2 ;;
    *) message=$1; have_message=1; shift ;;
    esac
done
if [ -z "$model" ] || [ "$have_message" = 0 ] || ! [ "$stages" -ge 1 ] 2>/dev/null; then
    gen_usage >&2
    exit 2
fi
[ -f "$model/config.json" ] || { echo "strata generate: no $model/config.json" >&2; exit 2; }
[ -f "$model/tokenizer.json" ] || { echo "strata generate: no $model/tokenizer.json" >&2; exit 2; }
# KV room for the prompt (a chat turn is a dozen tokens of template around the message) and
# the answer.
[ -n "$max_seq" ] || max_seq=$((max_tokens + ${#message} + 64))

pl_init
pl_start_pipeline gen "$stages" "$model" --max-seq "$max_seq"
pl_client gen --model "$model" "$mode" "$message" --max-tokens "$max_tokens" "${client_opts[@]}"
rc=$?
pl_stop_pipeline gen "$stages"
exit $rc
