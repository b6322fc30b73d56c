#!/usr/bin/env bash
# The device run of the GPU bundle (tools/gpu_bundle.sh builds it here into .gpu-bundle/,
# with this script): on a GPU machine that has only a driver (no CUDA toolkit, no Bazel, no
# packages), runs in a fixed order, each step under its own time limit:
#   1. the device as the driver sees it (nvidia-smi, when present);
#   2. the kernel tests and the op harness (every kernel against its reference op);
#   3. every golden case through the CUDA stage backend: decode graphs on (f16 KV), then
#      off; the speculative steps, batching, splits, the KV handover and a CPU -> GPU -> CPU
#      pipeline are inside that test; the grid tests (2 and 4 GPUs) say "skipped" on one;
#   4. the vision tower on the GPU and the NCCL group (skipped where NCCL is absent), and the
#      GPU's profile for the performance model (strata-stage --calibrate --device cuda:0, its
#      test, and the profile itself written to OUT/cuda0_profile.json);
#   5. strata-bench-matmul: the matmul's tuning variants on the 8B / 0.6B decode shapes
#      (which schedule of the weight loads streams fastest; every variant's bits checked);
#   6. bench gpu: decode tok/s at batch 1 / 8 / 32 and 2048-token prefill, next to the HBM
#      roofline, on the Qwen3-0.6B shape, then the 8B shape (its checkpoint is written on the
#      device by the bench itself).
#   7. where Nsight Compute's ncu is on the device: one 8B-shape decode step's kernels, each
#      timed (ncu_summary.py: time per kernel and grid, the step's total), to see where a
#      token's time goes (OUT/decode_profile.txt).
#   8. with ncu too: eight of that step's matmul launches through Nsight Compute's sections
#      (memory, warp stalls, issue, occupancy): what limits the decode GEMV
#      (OUT/matmul_profile.txt).
# Usage: .gpu-bundle/gpu_run.sh [OUT] (default $OUT, else /tmp/strata-gpu-run). One line per
# step to OUT/summary.txt: "ok|FAILED|skipped|TIMEOUT <step> <seconds> s: <its last line>";
# every step's log, packed again after each step, in OUT/gpu_logs.tgz (the device tool
# brings back at most 8 files, so the logs are not left in OUT one by one; checkpoints go to
# a work folder outside OUT). Where nvidia-smi lists a
# GPU, a step that skipped because the runtime saw no CUDA device at all ("no CUDA device (...)";
# one that lacks a second GPU for a grid still skips) is FAILED (a driver too old for the
# bundle's CUDA 13 runtime, say): a run that ran nothing must not read as a pass. On an H200
# (driver 580) steps 1-4 took 15 s, the benches 75 s with the 8B checkpoint's writing, the
# profile about 40 s (the matmul sections, not yet run there: about as long). Each step's
# limit only stops a hang: the device call's own timeout is the real bound, and what the
# steps before it wrote comes back. Exit 0 when nothing failed.
set -u
B=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-${OUT:-/tmp/strata-gpu-run}}
mkdir -p "$OUT"
LOGS=$(mktemp -d /tmp/strata-gpu-logs.XXXXXX)
WORK=$(mktemp -d /tmp/strata-gpu-work.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEST_SRCDIR="$B" TEST_WORKSPACE=strata # where the tests find tests/golden
summary="$OUT/summary.txt"
: >"$summary"
failed=0

# step NAME SECONDS COMMAND...
step() {
    local name=$1 limit=$2 t0 t1 rc verdict last
    shift 2
    t0=$(date +%s.%N)
    (cd "$B" && timeout -k 5 "$limit" "$@") >"$LOGS/$name.log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    last=$(grep -v '^\s*$' "$LOGS/$name.log" | tail -n 1 | cut -c1-200)
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        verdict=TIMEOUT
        failed=1
    elif { grep -q '^skipped' "$LOGS/$name.log" || [ "$rc" -eq 77 ]; } && [ "$gpus" -gt 0 ] &&
        grep -q 'no CUDA device (' "$LOGS/$name.log"; then
        verdict=FAILED # nvidia-smi lists a GPU that this runtime sees none of
        failed=1
    elif grep -q '^skipped' "$LOGS/$name.log" || [ "$rc" -eq 77 ]; then
        verdict=skipped
    elif [ "$rc" -eq 0 ]; then
        verdict=ok
    else
        verdict=FAILED
        failed=1
    fi
    printf '%-7s %-28s %6.1f s: %s\n' "$verdict" "$name" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$last" |
        tee -a "$summary"
    tar czf "$OUT/gpu_logs.tgz" -C "$LOGS" .
}

gpus=0
# the CPUs' topology too: whether the 16 are cores or hyperthreads decides what bench predict's
# stages, run side by side on this one box, do to each other
step device 20 sh -c 'nvidia-smi || echo "nvidia-smi: not present"; uname -a; nproc; free -g;
    lscpu || head -30 /proc/cpuinfo; cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list'
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
for t in add_rmsnorm argmax attention cuda_graph kv_store matmul moe_group qk_norm_rope rmsnorm \
    rope_cos_sin tree_sum vision_ops; do
    step "kernel_$t" 60 bin/kernels_${t}_test
done
step backend_ops_cuda 90 bin/backend_ops_cuda_test --backend=cuda
step golden_cuda 150 bin/golden_backends_cuda_test cuda:0 --kv-dtype f16
step golden_cuda_nographs 120 bin/golden_backends_cuda_test cuda:0 --no-graphs
step golden_cuda_grid 60 bin/golden_backends_cuda_test cuda:0 --grid 2,1 --grid 1,2
step vision_cuda 60 bin/vision_cuda_test
step nccl_group 60 bin/nccl_group_cuda_test
# The GPU's profile for strata-plan --predict (the performance model), kept with the results.
step calibrate_cuda 60 bin/calibrate_cuda_test
# (skipped, with its reason, where the test found no device)
step profile_cuda 60 sh -c 'if grep "^skipped" "$1"; then exit 0; fi
    exec prebuilt/runtime/strata-stage --calibrate --device cuda:0 --out "$2"' sh \
    "$LOGS/calibrate_cuda.log" "$OUT/cuda0_profile.json"
# The matmul's tuning variants side by side on the decode shapes (kernels/matmul_variants_bench.c).
step matmul_variants 120 prebuilt/kernels/strata-bench-matmul
step bench_gpu_0.6b 150 prebuilt/runtime/strata-bench-backend --device cuda:0 --shapes qwen3-0.6b \
    --batch 1,8,32 --prefill 2048 --dir "$WORK"
step bench_gpu_8b 240 prebuilt/runtime/strata-bench-backend --device cuda:0 --shapes qwen3-8b \
    --batch 1,8,32 --prefill 2048 --dir "$WORK" --keep
# One decode step of the 8B shape under ncu (its checkpoint kept by the step above): every
# kernel timed on its own, summed by kernel and grid (ncu_summary.py).
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
step profile_decode_8b 180 sh -c 'if [ -z "$1" ]; then echo "skipped: no ncu (Nsight Compute) here"; exit 0; fi
    command -v python3 >/dev/null || { echo "skipped: no python3 for ncu_summary.py"; exit 0; }
    "$1" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
        prebuilt/runtime/strata-bench-backend --device cuda:0 --shapes qwen3-8b --batch 1 \
        --steps 2 --context 16 --prefill 0 --dir "$2" --keep >"$2/ncu.csv" || exit 1
    python3 ncu_summary.py "$2/ncu.csv" | tee "$3"' sh "$ncu" "$WORK" "$OUT/decode_profile.txt"
# Why the matmul streams below the copy bandwidth: Nsight Compute's sections (speed of light,
# memory, warp stalls, scheduler, occupancy) on eight one-token matmul launches: the bench's
# passes (the context's fill, two untimed decode steps, two timed) each launch 145 (36
# layers x 4 and the head), so skipping 300 lands in the second decode step's third layer.
# Whether the loads wait on memory, the LSU / shared pipe, or issue slots decides the next
# schedule to try.
step profile_matmul_8b 150 sh -c 'if [ -z "$1" ]; then echo "skipped: no ncu (Nsight Compute) here"; exit 0; fi
    "$1" --clock-control none --kernel-name regex:matmul --launch-skip 300 --launch-count 8 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        --section SchedulerStats --section Occupancy --section LaunchStats \
        prebuilt/runtime/strata-bench-backend --device cuda:0 --shapes qwen3-8b --batch 1 \
        --steps 2 --context 16 --prefill 0 --dir "$2" --keep >"$3" 2>&1 || exit 1
    grep -E "matmul|Memory Throughput|DRAM Throughput|Duration|Stall|Issue Slots|Achieved Occupancy|Registers Per" "$3" | tail -n 40' \
    sh "$ncu" "$WORK" "$OUT/matmul_profile.txt"
echo "summary: $summary (logs: $OUT/gpu_logs.tgz)"
exit $failed
