#!/usr/bin/env bash
# Integration: stage 0's admission queue behind strata-serve. 2 stages with 2 KV slots
# (--max-batch 2) and room for 4 waiting requests (--max-queue 4), each step slowed so the
# requests overlap: a burst of 6 non-streamed greedy requests is answered 6 of 6 (those that
# waited give the same text as a solo run); a burst of 14 gets only 200s and 429s (never a
# 502), at least one 429, each 429 with Retry-After and the OpenAI rate_limit_error shape;
# afterwards a request is answered at once. Then a pool smaller than the slots (--kv-memory):
# requests wait for KV blocks, every one is answered the same, and every block returns. Last,
# prefix reuse: a long prompt sent twice is answered the same, the second with cached_tokens.
set -u
. "$(dirname "$0")/pipeline_lib.sh"
pl_init
command -v curl >/dev/null || pl_fail "curl is not installed (Debian package curl)"
SERVE="$PL_BIN/strata-serve"
model="$PL_WORK/model"
pl_make_text_model "$model"

pl_start_pipeline q 2 "$model" --max-seq 256 --max-batch 2 --max-queue 4 --step-delay-ms 40
# shellcheck disable=SC2046
"$SERVE" --model "$model" --stage0-port-file "$PL_WORK/q.0.port" --port-file "$PL_WORK/http.port" \
    --max-seq 256 $(pl_security_default) 2>>"$PL_WORK/serve.log" &
PL_PIDS="$PL_PIDS $!"
pl_wait_file "$PL_WORK/http.port" 20 || pl_fail "strata-serve did not start"
URL="http://127.0.0.1:$(cat "$PL_WORK/http.port")"
body='{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16, "temperature": 0}'

# ask TAG: one request; body in $PL_WORK/TAG.json, headers in TAG.hdr, status in TAG.code
ask() {
    curl -sS -o "$PL_WORK/$1.json" -D "$PL_WORK/$1.hdr" -w '%{http_code}' \
        -H 'Content-Type: application/json' --data-binary "$body" \
        "$URL/v1/chat/completions" >"$PL_WORK/$1.code" 2>>"$PL_WORK/curl.log"
}
text_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["message"]["content"])' "$1"; }
burst() { # N TAG: N requests at once
    local pids="" i
    for ((i = 0; i < $1; i++)); do
        ask "$2.$i" &
        pids="$pids $!"
    done
    for p in $pids; do wait "$p" || pl_fail "curl failed: $(cat "$PL_WORK/curl.log")"; done
}

ask solo
[ "$(cat "$PL_WORK/solo.code")" = 200 ] || pl_fail "solo request: $(cat "$PL_WORK/solo.json")"
solo=$(text_of "$PL_WORK/solo.json")

burst 6 a
for i in 0 1 2 3 4 5; do
    [ "$(cat "$PL_WORK/a.$i.code")" = 200 ] ||
        pl_fail "burst of 6 (2 slots + 4 waiting): request $i got $(cat "$PL_WORK/a.$i.code"): $(cat "$PL_WORK/a.$i.json")"
    [ "$(text_of "$PL_WORK/a.$i.json")" = "$solo" ] || pl_fail "burst request $i differs from the solo run"
done
echo "burst of 6 on 2 slots + a queue of 4: 6 of 6 answered, each equal to the solo run"

burst 14 b
ok=0 busy=0
for ((i = 0; i < 14; i++)); do
    code=$(cat "$PL_WORK/b.$i.code")
    case "$code" in
    200) ok=$((ok + 1)) ;;
    429)
        busy=$((busy + 1))
        grep -qi '^Retry-After: 1' "$PL_WORK/b.$i.hdr" || pl_fail "429 without Retry-After: $(cat "$PL_WORK/b.$i.hdr")"
        python3 -c 'import json,sys; e=json.load(open(sys.argv[1]))["error"]; assert e["type"] == "rate_limit_error" and e["code"] == "server_busy" and "--max-queue 4" in e["message"], e' \
            "$PL_WORK/b.$i.json" || pl_fail "429 body: $(cat "$PL_WORK/b.$i.json")"
        ;;
    *) pl_fail "burst of 14: request $i got $code (want 200 or 429): $(cat "$PL_WORK/b.$i.json")" ;;
    esac
done
[ "$ok" -ge 6 ] || pl_fail "burst of 14: only $ok answered (2 slots + 4 waiting hold 6)"
[ "$busy" -ge 1 ] || pl_fail "burst of 14: no 429 although 14 > 2 slots + 4 waiting"
echo "burst of 14: $ok answered, $busy refused with 429 + Retry-After, none failed"

ask last
[ "$(cat "$PL_WORK/last.code")" = 200 ] || pl_fail "after the bursts: $(cat "$PL_WORK/last.json")"
echo "after the bursts: answered at once (every slot and the queue free again)"

# A KV pool smaller than the slots (--kv-memory): 8 slots, blocks for two requests on stage
# 0 (the stage with the most layers; f16, the default KV dtype: 2 bytes an element).
# Requests reserve prompt + max_tokens when they start, so the others wait for blocks in the
# queue: a burst of 6 is answered 6 of 6, each equal to the solo run, and every block is back
# in the pool afterwards.
block=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); L=(c["num_hidden_layers"]+1)//2; print(2*2*L*c["num_key_value_heads"]*c.get("head_dim", c["hidden_size"]//c["num_attention_heads"])*16)' "$model/config.json")
pl_start_pipeline p 2 "$model" --max-seq 64 --max-batch 8 --max-queue 8 --step-delay-ms 20 \
    --kv-memory $((5 * block))
grep -q "^kv cache: 5 blocks of 16 positions = 80 tokens" "$PL_WORK/p.0.out" ||
    pl_fail "the summary does not show the pool: $(grep 'kv cache' "$PL_WORK/p.0.out")"
# shellcheck disable=SC2046
"$SERVE" --model "$model" --stage0-port-file "$PL_WORK/p.0.port" --port-file "$PL_WORK/http2.port" \
    --max-seq 64 $(pl_security_default) 2>>"$PL_WORK/serve2.log" &
PL_PIDS="$PL_PIDS $!"
pl_wait_file "$PL_WORK/http2.port" 20 || pl_fail "the second strata-serve did not start"
URL="http://127.0.0.1:$(cat "$PL_WORK/http2.port")"
burst 6 c
for i in 0 1 2 3 4 5; do
    [ "$(cat "$PL_WORK/c.$i.code")" = 200 ] ||
        pl_fail "burst of 6 on a pool for 2: request $i got $(cat "$PL_WORK/c.$i.code"): $(cat "$PL_WORK/c.$i.json")"
    [ "$(text_of "$PL_WORK/c.$i.json")" = "$solo" ] || pl_fail "pool burst request $i differs from the solo run"
done
curl -sS "$URL/v1/stages" >"$PL_WORK/stages.json" || pl_fail "GET /v1/stages failed"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))["data"]; assert d[0]["kv_blocks"] == 5 and all(s["kv_blocks_used"] == 0 and s["kv_blocks_reserved"] == 0 for s in d), d' \
    "$PL_WORK/stages.json" || pl_fail "/v1/stages after the burst: $(cat "$PL_WORK/stages.json")"
curl -sS "$URL/metrics" >"$PL_WORK/metrics.txt" || pl_fail "GET /metrics failed"
grep -q '^strata_stage_kv_blocks{stage="0"} 5$' "$PL_WORK/metrics.txt" ||
    pl_fail "/metrics has no strata_stage_kv_blocks for stage 0"
# The four that waited for blocks, admitted from the queue after a wait (20 ms steps).
python3 - "$PL_WORK/metrics.txt" "$PL_WORK/stages.json" <<'PY' || pl_fail "queue counters: $(grep queue "$PL_WORK/metrics.txt")"
import json, re, sys
m = dict(re.findall(r'^(strata_stage_queue_\w+\{[^}]*\}) (\S+)$', open(sys.argv[1]).read(), re.M))
q, a = float(m['strata_stage_queue_requests_total{stage="0"}']), float(m['strata_stage_queue_admitted_total{stage="0"}'])
assert q >= 3 and a == q, m
assert float(m['strata_stage_queue_wait_seconds_total{stage="0"}']) > 0, m
assert float(m['strata_stage_queue_refused_total{stage="0",reason="full"}']) == 0, m
t = json.load(open(sys.argv[2]))["data"][0]["totals"]
assert t["requests_queued"] == q and t["queue_wait_ms"] > 0, t
PY
echo "burst of 6 on 8 slots but KV blocks for 2: 6 of 6 answered, each equal to the solo run; every block back"

# Prefix reuse behind strata-serve: the same long prompt twice; the second reuses the first's
# whole blocks (usage.prompt_tokens_details.cached_tokens) and answers the same text.
body='{"messages": [{"role": "user", "content": "Tell me about the layers of a pipeline that runs a transformer across several machines, one stage after another."}], "max_tokens": 8, "temperature": 0}'
ask long1
ask long2
for t in long1 long2; do
    [ "$(cat "$PL_WORK/$t.code")" = 200 ] || pl_fail "$t: $(cat "$PL_WORK/$t.json")"
done
cached() { python3 -c 'import json,sys; u=json.load(open(sys.argv[1]))["usage"]; print(u["prompt_tokens_details"]["cached_tokens"], u["prompt_tokens"])' "$1"; }
read -r c1 p1 <<<"$(cached "$PL_WORK/long1.json")"
read -r c2 p2 <<<"$(cached "$PL_WORK/long2.json")"
[ "$c1" = 0 ] || pl_fail "the first long request reused $c1 tokens from an empty cache"
[ "$c2" -ge 16 ] && [ $((c2 % 16)) = 0 ] && [ "$c2" -lt "$p2" ] ||
    pl_fail "the second long request reused $c2 of $p2 prompt tokens (want whole blocks, not all)"
[ "$(text_of "$PL_WORK/long2.json")" = "$(text_of "$PL_WORK/long1.json")" ] ||
    pl_fail "the answer served from cached blocks differs from the cold one"
curl -sS "$URL/metrics" >"$PL_WORK/metrics.txt" || pl_fail "GET /metrics failed"
grep -q '^strata_stage_kv_blocks_cached{stage="1"} [1-9]' "$PL_WORK/metrics.txt" ||
    pl_fail "/metrics shows no cached blocks on stage 1"
grep -q "^strata_stage_prefix_cached_tokens_total{stage=\"0\"} $c2\$" "$PL_WORK/metrics.txt" &&
    grep -q '^strata_stage_prefix_hits_total{stage="0"} 1$' "$PL_WORK/metrics.txt" ||
    pl_fail "prefix counters: $(grep prefix "$PL_WORK/metrics.txt")"
echo "the same $p2-token prompt again: $c2 tokens from the KV cache, the same answer"
