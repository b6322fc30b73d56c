#!/bin/bash
# End-to-end test of the strata-plan binary on the committed tiny checkpoint: the even
# split, the memory-proportional split, the PP x KVP x TP process table (and a MoE golden's
# expert shards), and the documented exit codes (2 usage, 3 input).
set -u
plan="$1"
model="$2"
moe="$3"
fail=0

check() { # name, expected exit code, expected output substring, args...
    local name="$1" want_rc="$2" want_text="$3"
    shift 3
    local out rc
    out="$("$plan" "$@" 2>&1)"
    rc=$?
    if [[ $rc -ne $want_rc ]]; then
        echo "FAIL $name: exit $rc, want $want_rc"; echo "$out"; fail=1; return
    fi
    if [[ "$out" != *"$want_text"* ]]; then
        echo "FAIL $name: output lacks \"$want_text\""; echo "$out"; fail=1; return
    fi
    echo "ok   $name"
}

check even 0 "[2, 4)" --model "$model" --stages 2
check even-first 0 "[0, 2)" --model "$model" --stages 2
check weights 0 "47 tensors checked" --model "$model" --stages 2
check three-stages 0 "[3, 4)" --model "$model" --stages 3
check mem 0 "used" --model "$model" --stages 2 --mem 64M,32M --max-seq 1024
check split-decode 0 "decode-balanced split" --model "$model" --stages 2 --split decode
check split-decode-streamed 0 "streamed" --model "$model" --stages 2 --split decode
check split-bad 2 "--split wants even or decode" --model "$model" --stages 2 --split fast
check split-with-mem 2 "not with --mem" --model "$model" --stages 2 --split decode --mem 1G,1G
check help 0 "usage: strata-plan" --help
check no-args 2 "required" 
check bad-stages 2 "--stages" --model "$model" --stages zero
check too-many-stages 2 "every stage needs a layer" --model "$model" --stages 5
check mem-count 2 "--mem lists 1 nodes" --model "$model" --stages 2 --mem 1G
check mem-syntax 2 "bad size" --model "$model" --stages 2 --mem 1G,12X
check missing-model 3 "No such file" --model /nonexistent/model --stages 2
check ranges 0 "[1, 4)" --model "$model" --ranges 0-1,1-4
check ranges-mem 0 "used" --model "$model" --ranges 0-3,3-4 --mem 64M,64M
check ranges-mem-overflow 3 "does not fit" --model "$model" --ranges 0-3,3-4 --mem 64M,1M
check ranges-overlap 2 "overlap" --model "$model" --ranges 0-3,2-4
check ranges-gap 2 "no stage owns layers [2, 3)" --model "$model" --ranges 0-2,3-4
check ranges-empty 2 "empty" --model "$model" --ranges 0-4,4-4
check ranges-outside 2 "outside" --model "$model" --ranges 0-2,2-9
check ranges-syntax 2 "expected START-END" --model "$model" --ranges 0-2,x
check ranges-count 2 "--ranges lists 2 stages but --stages is 3" --model "$model" --stages 3 --ranges 0-2,2-4
check no-fit 3 "does not fit" --model "$model" --stages 2 --mem 1M,1M
# The grid (tiny_qwen3: 2 heads, 1 KV head, F 32, V 128, 4 layers).
check grid-table 0 "PP 2 x KVP 2 x TP 2 = 8 processes" --model "$model" --stages 2 --tp 2 --kvp 2 --max-seq 1024
check grid-last-rank 0 "7     1     1    1   [2,4)     [1,2)     [0,1)x2    [16,32)     -            [64,128)     [512,1024)" \
    --model "$model" --stages 2 --tp 2 --kvp 2 --max-seq 1024
check grid-kv-replicated 0 "1 of 1 KV heads (replicated" --model "$model" --stages 1 --tp 2
check grid-kvp-only 0 "[384,400)" --model "$model" --stages 1 --kvp 4 --kvp-tokens 128 --max-seq 400
check grid-kvp-aligned 2 "100 KV tokens per KVP group is not 16 x a power of two" --model "$model" --stages 1 --kvp 4 --kvp-tokens 100 --max-seq 400
check grid-tp-pow2 2 "TP 3 is not a power of two dividing 8" --model "$model" --stages 1 --tp 3
check grid-heads 2 "TP 4 does not divide the 2 attention heads" --model "$model" --stages 2 --tp 4
check grid-kvp-short 2 "hold 256 tokens, fewer than max-seq 1024" --model "$model" --stages 2 --kvp 2 --kvp-tokens 128 --max-seq 1024
check grid-kvp-empty 2 "KVP rank 3 would hold no tokens" --model "$model" --stages 2 --kvp 4 --kvp-tokens 512 --max-seq 1024
check grid-tp-zero 2 "--tp" --model "$model" --stages 2 --tp 0
check grid-moe-flag 2 "--moe must be expert or split" --model "$model" --stages 2 --tp 2 --moe rows
check grid-mem 2 "--mem plans whole stages" --model "$model" --stages 2 --tp 2 --mem 1G,1G
check grid-stages 2 "every stage needs a layer" --model "$model" --stages 5 --tp 2
check grid-experts 2 "TP 4 does not divide the 6 experts" --model "$moe" --stages 2 --tp 4
check grid-experts-ep 0 "[3,6)" --model "$moe" --stages 2 --tp 2
check grid-experts-split 0 "all:[24,32)" --model "$moe" --stages 2 --tp 4 --moe split
check grid-tensors 0 "model.layers.3.mlp.down_proj.weight                          dim 1 [16, 32) of 32" \
    --model "$model" --stages 2 --tp 2 --tensors 3
check grid-tensors-kv 0 "model.layers.2.self_attn.k_proj.weight                       whole" \
    --model "$model" --stages 2 --tp 2 --tensors 3
check grid-tensors-range 2 "the grid has ranks 0 to 3" --model "$model" --stages 2 --tp 2 --tensors 4
check grid-tensors-expert 0 "model.layers.0.mlp.experts.3.gate_proj.weight                whole" \
    --model "$moe" --stages 1 --tp 2 --tensors 1
check grid-tensors-split 0 "model.layers.0.mlp.experts.0.down_proj.weight                dim 1 [16, 32) of 32" \
    --model "$moe" --stages 1 --tp 2 --moe split --tensors 1
# A checkpoint whose config disagrees with its weights: every mis-shaped tensor is listed.
broken="${TEST_TMPDIR:-/tmp}/broken_model"
mkdir -p "$broken"
cp "$model/model.safetensors" "$broken/"
sed 's/"intermediate_size": 32/"intermediate_size": 48/' "$model/config.json" > "$broken/config.json"
check broken-shapes 3 "12 tensor(s) with the wrong shape" --model "$broken" --stages 2
check broken-list 3 "wrong shape model.layers.3.mlp.down_proj.weight is [16,32], expected [16,48]" \
    --model "$broken" --stages 2
# --predict: the performance model with a profile written from a specification, and one that
# strata-stage --calibrate measured on this box (the fourth argument, when given).
tmp="${TEST_TMPDIR:-/tmp}/plan_predict"
mkdir -p "$tmp"
printf '{"name": "spec box", "source": "spec", "device": "cpu", "threads": 8, "read_gbps": 50,\n "gemv_gbps": 20, "gemm_gflops": 500}\n' >"$tmp/spec.json"
check predict 0 "tokens/s at batch 1" --model "$model" --stages 2 --predict --profile "$tmp/spec.json"
check predict-batch 0 "tokens/s at batch 8" --model "$moe" --stages 2 --predict --profile "$tmp/spec.json" --batch 8
check predict-bottleneck 0 "bottleneck: " --model "$model" --stages 2 --predict \
    --profile "$tmp/spec.json,$tmp/spec.json" --prompt-tokens 512 --link-latency-us 2000 --link-gbps 0.1
# a probe's link file (--link): each hop by its frame's size; bad ones exit 2 saying why
printf '{"latency_us": 1000, "gbps": 0.25, "points": [{"bytes": 196, "mean_us": 3000}, {"bytes": 4288, "mean_us": 5000}]}\n' >"$tmp/link.json"
check predict-link 0 "probed at 2 frame sizes" --model "$model" --stages 2 --predict --profile "$tmp/spec.json" \
    --link "$tmp/link.json"
printf '{"latency_us": 1000, "gbps": 0.25, "points": [{"bytes": 4288, "mean_us": 5000}, {"bytes": 196, "mean_us": 3000}]}\n' >"$tmp/badlink.json"
check predict-link-bad 2 "not a link" --model "$model" --stages 2 --predict --profile "$tmp/spec.json" \
    --link "$tmp/badlink.json"
check predict-link-missing 2 "--link: cannot open" --model "$model" --stages 2 --predict \
    --profile "$tmp/spec.json" --link "$tmp/none.json"
check predict-json 0 '"decode_tokens_per_s": ' --model "$model" --stages 2 --predict --profile "$tmp/spec.json" --json
out=$("$plan" --model "$model" --stages 2 --predict --profile "$tmp/spec.json" --json 2>&1)
if python3 -c 'import json, sys; d = json.loads(sys.argv[1]); assert len(d["stages"]) == 2 and d["predicted"]["ttft_ms"] > 0' "$out"; then
    echo "ok   predict-json-parses"
else
    echo "FAIL predict-json-parses: $out"; fail=1
fi
# --tp with --predict: each stage a TP group: each rank streams its share of a 32B model's
# weights (config.json alone), which outweighs the all-reduces (on a tiny model they would not)
q32="$(dirname "$0")/../../docs/plan_examples/qwen3-32b"
r1=$("$plan" --model "$q32" --stages 1 --predict --profile "$tmp/spec.json" --json | sed -n 's/.*"decode_tokens_per_s": \([0-9.]*\).*/\1/p')
r2=$("$plan" --model "$q32" --stages 1 --tp 2 --predict --profile "$tmp/spec.json" --json | sed -n 's/.*"decode_tokens_per_s": \([0-9.]*\).*/\1/p')
if awk -v a="$r1" -v b="$r2" 'BEGIN { exit !(a > 0 && b > a) }'; then
    echo "ok   predict-tp: $r1 -> $r2 tokens/s with --tp 2"
else
    echo "FAIL predict-tp: $r1 -> $r2 tokens/s with --tp 2"; fail=1
fi
check predict-no-profile 2 "--predict needs --profile" --model "$model" --stages 2 --predict
check predict-profile-count 2 "lists more than the 2 stages" --model "$model" --stages 2 --predict \
    --profile "$tmp/spec.json,$tmp/spec.json,$tmp/spec.json"
printf '{"read_gbps": 1}' >"$tmp/bad.json"
check predict-bad-profile 3 '"gemv_gbps" is missing' --model "$model" --stages 2 --predict --profile "$tmp/bad.json"
check predict-missing-profile 3 "cannot open" --model "$model" --stages 2 --predict --profile "$tmp/none.json"
# --hosts: the placement over two spec boxes (one fast with little memory), JSON, refusals
printf '{"name": "fast", "source": "spec", "threads": 16, "read_gbps": 200, "gemv_gbps": 100, "gemm_gflops": 2000}\n' >"$tmp/fast.json"
printf '{"hosts": [{"name": "slowbox", "profile": "spec.json", "mem": "1G"}, {"name": "fastbox", "profile": "fast.json", "mem": "1G"}], "link": {"latency_us": 500, "gbps": 1}}\n' >"$tmp/hosts.json"
check hosts 0 "fastbox: strata-stage --model $model --num-stages 1" --model "$model" --hosts "$tmp/hosts.json"
# a host's "cpus" goes into its line as --cpus; malformed or too few for its threads: refused
printf '{"hosts": [{"name": "fastbox", "profile": "fast.json", "mem": "1G", "cpus": "0-15,32"}]}\n' >"$tmp/hosts-cpus.json"
check hosts-cpus 0 "--threads 16 --cpus 0-15,32" --model "$model" --hosts "$tmp/hosts-cpus.json"
printf '{"hosts": [{"name": "fastbox", "profile": "fast.json", "mem": "1G", "cpus": "0-7"}]}\n' >"$tmp/hosts-cpus-few.json"
check hosts-cpus-few 3 "hosts[0].cpus: 8 CPU(s) for 16 threads" --model "$model" --hosts "$tmp/hosts-cpus-few.json"
printf '{"hosts": [{"name": "fastbox", "profile": "fast.json", "mem": "1G", "cpus": "7-0"}]}\n' >"$tmp/hosts-cpus-bad.json"
check hosts-cpus-bad 3 'hosts[0].cpus: a CPU list such as "0-31"' --model "$model" --hosts "$tmp/hosts-cpus-bad.json"
check hosts-compare 0 "even, all hosts in file order" --model "$model" --hosts "$tmp/hosts.json" --goal throughput --batch 8
out=$("$plan" --model "$model" --hosts "$tmp/hosts.json" --json 2>&1)
if python3 -c 'import json, sys; d = json.loads(sys.argv[1]); assert d["stages"][0]["host"] == "fastbox" and d["predicted"]["decode_tokens_per_s"] > 0' "$out"; then
    echo "ok   hosts-json"
else
    echo "FAIL hosts-json: $out"; fail=1
fi
# "links": the pairs whose link differs. Three boxes that hold half the model each, a's links
# to b and to c across a 20 ms WAN: the placement runs on b and c (the file order's even plan,
# a -> b -> c, pays the WAN twice); a pair naming no host, a pair twice, a bad link: refused.
hosts3() { # LINKS: three 45K fast boxes with those "links"
    printf '{"hosts": [{"name": "a", "profile": "fast.json", "mem": "45K"}, {"name": "b", "profile": "fast.json", "mem": "45K"}, {"name": "c", "profile": "fast.json", "mem": "45K"}], "link": {"latency_us": 100, "gbps": 1}, "links": [%s]}\n' "$1"
}
wan='{"between": ["a", "b"], "latency_us": 20000, "gbps": 0.1}, {"between": ["c", "a"], "latency_us": 20000, "gbps": 0.1}'
hosts3 "$wan" >"$tmp/links.json"
check hosts-links 0 "b: strata-stage --model $model --num-stages 2 --stage-idx 0" --model "$model" --hosts "$tmp/links.json" --max-seq 64 --chunk 8
check hosts-links-next 0 "--stage-idx 1 --layer-start 2 --layer-end 4 --threads 16 --listen 0.0.0.0:7000 --next-host b" --model "$model" --hosts "$tmp/links.json" --max-seq 64 --chunk 8
# the same links as measured files (strata-stage --probe-links writes them), and a missing one
printf '{"latency_us": 20000.0, "gbps": 0.1000, "source": "measured by strata-stage --probe-links: stage 0 to stage 1", "points": []}\n' >"$tmp/wan-probe.json"
hosts3 '{"between": ["a", "b"], "probe": "wan-probe.json"}, {"between": ["c", "a"], "probe": "wan-probe.json"}' >"$tmp/links-probe.json"
check hosts-links-probe 0 "b: strata-stage --model $model --num-stages 2 --stage-idx 0" --model "$model" --hosts "$tmp/links-probe.json" --max-seq 64 --chunk 8
hosts3 '{"between": ["a", "b"], "probe": "absent.json"}' >"$tmp/links-noprobe.json"
check hosts-links-probe-absent 3 'links[0] needs "latency_us" >= 0 and "gbps" > 0, or "probe"' --model "$model" --hosts "$tmp/links-noprobe.json"
hosts3 '{"between": ["a", "z"], "latency_us": 1, "gbps": 1}' >"$tmp/links-bad.json"
check hosts-links-name 3 'links[0].between needs two different host names' --model "$model" --hosts "$tmp/links-bad.json"
hosts3 '{"between": ["a", "b"], "latency_us": 1, "gbps": 1}, {"between": ["b", "a"], "latency_us": 2, "gbps": 1}' >"$tmp/links-twice.json"
check hosts-links-twice 3 "links[1]: b and a are linked twice" --model "$model" --hosts "$tmp/links-twice.json"
hosts3 '{"between": ["a", "b"], "latency_us": -1, "gbps": 1}' >"$tmp/links-neg.json"
check hosts-links-value 3 'links[0] needs "latency_us" >= 0' --model "$model" --hosts "$tmp/links-neg.json"
# A host with 2 devices runs its stage as one group of them (TP 2 or KVP 2, whichever the model
# prices faster; a process per device), each device holding its share: a model no single
# device of the pair holds fits the pair.
printf '{"hosts": [{"name": "pair", "profile": "fast.json", "mem": "45K", "devices": 2, "device_link": {"latency_us": 5, "gbps": 50}}]}\n' >"$tmp/tp.json"
check hosts-tp 0 "--tp-peers pair:7100,pair:7101" --model "$model" --hosts "$tmp/tp.json" --max-seq 64 --chunk 8
out=$("$plan" --model "$model" --hosts "$tmp/tp.json" --max-seq 64 --chunk 8 --json 2>&1)
if python3 -c 'import json, sys; d = json.loads(sys.argv[1]); s = d["stages"][0]; assert s["tp"] * s["kvp"] == 2' "$out"; then
    echo "ok   hosts-tp-json"
else
    echo "FAIL hosts-tp-json: $out"; fail=1
fi
printf '{"hosts": [{"name": "pair", "profile": "fast.json", "mem": "45K"}]}\n' >"$tmp/tp1.json"
check hosts-tp-needed 3 "no placement fits" --model "$model" --hosts "$tmp/tp1.json" --max-seq 64 --chunk 8
printf '{"hosts": [{"name": "odd", "profile": "fast.json", "mem": "1G", "devices": 3}]}\n' >"$tmp/tp3.json"
check hosts-tp-odd 3 "devices: 1, 2, 4 or 8" --model "$model" --hosts "$tmp/tp3.json"
# 4 devices and a model of 2 heads: no TP 4, but KV parallelism over the 4 (or TP 2 x KVP 2):
# each rank's line carries its KVP rank and positions; with a --max-seq that leaves a KVP rank
# without positions, no split fits and the host is refused with the reason.
printf '{"hosts": [{"name": "big", "profile": "fast.json", "mem": "1G", "devices": 4}]}\n' >"$tmp/tp4.json"
check hosts-kvp 0 "--kvp-rank 1 --kvp-tokens" --model "$model" --hosts "$tmp/tp4.json" --max-seq 256
out=$("$plan" --model "$model" --hosts "$tmp/tp4.json" --max-seq 256 --json 2>&1)
if python3 -c 'import json, sys; d = json.loads(sys.argv[1]); s = d["stages"][0]; assert s["kvp"] >= 2 and s["tp"] * s["kvp"] == 4' "$out"; then
    echo "ok   hosts-kvp-json"
else
    echo "FAIL hosts-kvp-json: $out"; fail=1
fi
check hosts-tp-model 3 "whole query heads) (and no KV-parallel split of them fits either)" --model "$model" --hosts "$tmp/tp4.json" --max-seq 16
printf '{"hosts": [{"name": "a", "profile": "spec.json", "mem": "16K"}, {"name": "b", "profile": "fast.json", "mem": "16K"}]}\n' >"$tmp/tiny.json"
check hosts-no-fit 3 "no placement fits" --model "$model" --hosts "$tmp/tiny.json"
printf '{"hosts": [{"name": "a"}]}\n' >"$tmp/noprof.json"
check hosts-bad 3 'needs "name" and "profile"' --model "$model" --hosts "$tmp/noprof.json"
check hosts-with-stages 2 "--hosts chooses the stages" --model "$model" --hosts "$tmp/hosts.json" --stages 2
check hosts-goal 2 "--goal wants latency or throughput" --model "$model" --hosts "$tmp/hosts.json" --goal fastest
if [ -n "${4:-}" ]; then # a measured profile: strata-stage --calibrate on this box
    if "$4" --calibrate --threads 1 --out "$tmp/measured.json" 2>"$tmp/cal.err" &&
        grep -q '"source": "measured"' "$tmp/measured.json"; then
        echo "ok   calibrate: $(tail -1 "$tmp/cal.err")"
        check predict-measured 0 "(measured)" --model "$model" --stages 1 --predict --profile "$tmp/measured.json"
    else
        echo "FAIL calibrate: $(cat "$tmp/cal.err")"; fail=1
    fi
    # a GPU: measured where there is one, else refused naming why (exit 1); a device no
    # backend knows is a usage error
    "$4" --calibrate --device cuda:0 --out "$tmp/gpu.json" >"$tmp/gpu.out" 2>&1
    rc=$?
    if { [ $rc -eq 0 ] && grep -q '"device": "cuda"' "$tmp/gpu.json"; } ||
        { [ $rc -eq 1 ] && grep -Eq "cuda:0|no CUDA" "$tmp/gpu.out"; }; then
        echo "ok   calibrate --device cuda:0: exit $rc: $(tail -1 "$tmp/gpu.out")"
    else
        echo "FAIL calibrate --device cuda:0: exit $rc: $(cat "$tmp/gpu.out")"; fail=1
    fi
    "$4" --calibrate --device tpu >/dev/null 2>&1
    if [ $? -eq 2 ]; then echo "ok   calibrate --device tpu is a usage error"; else echo "FAIL calibrate --device tpu"; fail=1; fi
fi
exit $fail
