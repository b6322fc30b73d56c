#!/usr/bin/env bash
# The README's published predictions: strata-plan --hosts for Qwen3-VL-235B-A22B and Qwen3-32B
# (docs/plan_examples/*/config.json: config only, no weights) on 4, 8, 16 and 32 boxes of one
# kind each, prints a Markdown table: stages used, the largest stage's memory, time to first
# token for a 2048-token prompt, tokens/s at batch 1 (its own best placement: --goal latency)
# and at batch 32 (--goal throughput), KV for 32 sequences of 4096 positions in f16.
# The box kinds' profiles and where each figure comes from are written below (spec sheets and
# this session's CPU calibration); the model's limits are perf_model.h's.
# Usage: tools/plan_table.sh [PLAN_BINARY]   (default: bazel-bin/runtime/strata-plan)
set -eu
cd "$(dirname "$0")/.."
PLAN=${1:-bazel-bin/runtime/strata-plan}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Peak figures from the vendors' specifications (no efficiency factor: upper bounds).
cat >"$tmp/gpu80.json" <<'J'
{"name": "80 GB GPU (H100 SXM spec)", "source": "spec", "device": "cuda", "threads": 1,
 "read_gbps": 3350, "gemv_gbps": 3350, "gemm_gflops": 989000}
J
cat >"$tmp/gpu24.json" <<'J'
{"name": "24 GB GPU (RTX 4090 spec)", "source": "spec", "device": "cuda", "threads": 1,
 "read_gbps": 1008, "gemv_gbps": 1008, "gemm_gflops": 165000}
J
# Measured, not specified: one H200 as Strata's CUDA backend ran it in a device run (strata-stage
# --calibrate --device cuda after the matmul's 16-byte loads: one-row bf16 matmul 1599 GB/s of
# the device's 3947 GB/s copy bandwidth, 8.0 TFLOP/s at 64 rows in the reference's fp32 order,
# no tensor cores): what today's kernels give, beside the H100's spec bound.
cat >"$tmp/h200.json" <<'J'
{"name": "H200 (Strata's kernels, measured)", "source": "measured", "device": "cuda", "threads": 1,
 "read_gbps": 3946.681, "gemv_gbps": 1598.694, "gemm_gflops": 7972.101,
 "gemv_gbps_by_bytes": {"33554432": 1627.908, "134217728": 1600.312, "536870912": 1598.694},
 "gemm_gflops_by_k": {"1024": 6997.579, "2048": 7718.126, "4096": 7972.101, "8192": 6215.875},
 "gemm_split_gflops_by_k": {"1024": 3729.624, "2048": 4786.028, "4096": 5324.278, "8192": 3519.717}}
J
# A 16-thread CPU box: a 2-core Xeon calibrated per thread (strata-stage --calibrate
# --threads 1: bf16 matmul 6.2 GB/s at one row, 96 GFLOP/s at 64; attention, re-measured
# after its queries-as-lanes loops, 78 GFLOP/s and 6.4 GB/s) times 16, memory read at
# 200 GB/s (8-channel DDR5, achievable).
cat >"$tmp/cpu.json" <<'J'
{"name": "128 GB CPU box, 16 threads", "source": "spec", "device": "cpu", "threads": 16,
 "read_gbps": 200, "gemv_gbps": 99, "gemm_gflops": 1536, "attn_gflops": 1248, "attn_gbps": 103}
J
hosts() { # KIND MEM N LATENCY_US GBPS
    local i sep=""
    printf '{"hosts": ['
    for ((i = 0; i < $3; i++)); do
        printf '%s{"name": "%s%d", "profile": "%s.json", "mem": "%s"}' "$sep" "$1" "$i" "$1" "$2"
        sep=", "
    done
    printf '], "link": {"latency_us": %s, "gbps": %s}}\n' "$4" "$5"
}
num() { sed -n "s/.*\"$2\": *\([0-9.e+-]*\).*/\1/p" "$1" | head -1; }
echo "| model | boxes | link | stages | largest stage | first token, 2k prompt | tokens/s, batch 1 | tokens/s, batch 32 |"
echo "|---|---|---|---|---|---|---|---|"
for model in qwen3-vl-235b-a22b qwen3-32b; do
    for kind in "gpu80 76G 20 12.5 100GbE" "h200 135G 20 12.5 100GbE" "gpu24 22G 50 1.25 10GbE" "cpu 120G 50 1.25 10GbE" "cpu 120G 20000 0.125 WAN-20ms"; do
        read -r k mem lat gbps linkname <<<"$kind"
        for n in 4 8 16 32; do
            hosts "$k" "$mem" "$n" "$lat" "$gbps" >"$tmp/h.json"
            name=$(sed -n 's/.*"name": "\([^"]*\)".*/\1/p' "$tmp/$k.json" | head -1)
            common=(--model "docs/plan_examples/$model" --hosts "$tmp/h.json" --max-seq 4096 --kv-bytes 2
                --prompt-tokens 2048 --json)
            if "$PLAN" "${common[@]}" --batch 32 --goal throughput >"$tmp/t.json" 2>"$tmp/err" &&
                "$PLAN" "${common[@]}" --batch 1 --goal latency >"$tmp/l.json" 2>>"$tmp/err"; then
                stages=$(grep -c '"host"' "$tmp/t.json")
                big=$(grep -o '"memory_bytes": [0-9]*' "$tmp/t.json" | awk '{ if ($2 > m) m = $2 } END { printf "%.1f GiB", m / 1073741824 }')
                printf "| %s | %d x %s | %s | %s | %s | %s | %.1f | %.0f |\n" "$model" "$n" "$name" \
                    "$linkname" "$stages" "$big" "$(awk -v t="$(num "$tmp/l.json" ttft_ms)" 'BEGIN {
                        if (t >= 10000) printf "%.0f s", t / 1000; else if (t >= 1000) printf "%.1f s", t / 1000;
                        else printf "%.0f ms", t }')" \
                    "$(num "$tmp/l.json" decode_tokens_per_s)" "$(num "$tmp/t.json" decode_tokens_per_s_batch)"
            else
                printf "| %s | %d x %s | %s | - | does not fit | - | - | - |\n" "$model" "$n" "$name" "$linkname"
            fi
        done
    done
done
