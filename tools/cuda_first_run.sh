#!/usr/bin/env bash
# The first commands of a device session for the CUDA backend (kernels/README.md), in order,
# each under a time limit, every output kept: nothing in kernels/ or
# runtime/stage/backend_cuda*.c had run on a GPU when this was written, so the point is to
# learn in one pass which parts hold. Usage:
#   tools/cuda_first_run.sh [--out DIR] [PART...]
# PARTs, run in this order (default: build kernels golden bench):
#   build    bazel build of the GPU tests and the bench (minutes on a fresh machine)
#   kernels  tests/kernels/*, the op harness against the reference, the NCCL group (seconds)
#   golden   every golden case through the CUDA stage backend, decode graphs on, then off;
#            the vision tower on the GPU (vision_cuda_test, and the VL pipeline with
#            strata-stage --role vision --device cuda:0 against HF's ids)
#   bench    the Qwen3-0.6B shape, graphs on and off (STRATA_CUDA_GRAPHS=0); 1 vs 2
#            strata-stage processes on the GPU (tools/bench_gpu_hop.sh: the hop's cost)
#   longctx  decode at 16k context on the 0.6B shape (split-K attention; KV in the roofline)
#   full     ./strata bench gpu (writes ~31 GB of checkpoints under /tmp; 10+ minutes)
# Where a command may run at most ~10 minutes, run the parts one call at a time.
# --out DIR (default /tmp/strata-cuda-first-run) receives one log per step and summary.txt
# (appended to). Exit status 0 when every step passed or skipped, 1 otherwise; a step that
# prints "skipped:" (or a bench exiting 77) did not see the device: check nvidia-smi and that
# the driver supports CUDA 13.
set -u
cd "$(dirname "$0")/.."
out=/tmp/strata-cuda-first-run
parts=""
while [ $# -gt 0 ]; do
    case "$1" in
    --out) out=$2; shift ;;
    -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
    build | kernels | golden | bench | longctx | full) parts="$parts $1" ;;
    *) echo "cuda_first_run.sh: unknown part '$1' (--help)" >&2; exit 2 ;;
    esac
    shift
done
[ -n "$parts" ] || parts="build kernels golden bench"
mkdir -p "$out/kernels"
summary="$out/summary.txt"
failed=0

# step NAME SECONDS COMMAND...: runs it, keeps its output in NAME.log, one summary line.
step() {
    local name=$1 secs=$2 rc start
    shift 2
    start=$(date +%s)
    timeout "$secs" "$@" >"$out/$name.log" 2>&1
    rc=$?
    local verdict=passed
    if grep -q '^skipped:' "$out/$name.log" || [ "$rc" = 77 ]; then
        verdict=skipped
        rc=0
    fi
    if [ "$rc" != 0 ]; then verdict="FAILED (exit $rc)"; failed=1; fi
    printf '%-28s %-18s %5ss\n' "$name" "$verdict" "$(($(date +%s) - start))" | tee -a "$summary"
}

has() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
bin=bazel-bin
step nvidia-smi 30 nvidia-smi
if has build; then
    step build 1200 bazel build //tests/kernels/... //tests/backend_ops/... \
        //tests/runtime/stage:nccl_group_cuda_test //tests/runtime/stage:vision_cuda_test \
        //runtime:strata-bench-backend //runtime:strata-stage //runtime:strata-client \
        //reference/tools:strata-bench-decode
fi
if has kernels; then
    for t in cuda_graph_test argmax_test kv_store_test matmul_test moe_group_test attention_test \
        rmsnorm_test rope_cos_sin_test vision_ops_test tree_sum_test; do
        step "kernels/$t" 300 "$bin/tests/kernels/$t"
    done
    # NCCL sub-groups (TP 2 x KVP 2, TP 4, TP 8, a stalled rank): one GPU per rank, so on a
    # one-GPU machine only the one-rank cases run and the rest print "skipped:" with why.
    step nccl_group_cuda 300 "$bin/tests/runtime/stage/nccl_group_cuda_test"
    step backend_ops_cuda 600 "$bin/tests/backend_ops/backend_ops_cuda_test" --backend=cuda
fi
if has golden; then
    step golden_cuda 600 bazel test //tests/backend_ops:golden_backends_cuda_test \
        --test_output=all
    step golden_cuda_nographs 600 bazel test \
        //tests/backend_ops:golden_backends_cuda_nographs_test --test_output=all
    step vision_cuda 300 "$bin/tests/runtime/stage/vision_cuda_test"
    step pipeline_vision_cuda 600 bazel test //tests/pipeline:pipeline_vision_test \
        --test_env=STRATA_TEST_VISION_DEVICE=cuda:0 --test_output=all
fi
if has bench; then
    step bench_0.6b_graphs 600 "$bin/runtime/strata-bench-backend" --device cuda:0 \
        --shapes qwen3-0.6b --batch 1,8,32 --prefill 2048 --dir /tmp --keep
    step bench_0.6b_nographs 600 env STRATA_CUDA_GRAPHS=0 "$bin/runtime/strata-bench-backend" \
        --device cuda:0 --shapes qwen3-0.6b --batch 1,8,32 --prefill 0 --dir /tmp --keep
    step bench_gpu_hop 600 tools/bench_gpu_hop.sh --device cuda:0
fi
if has longctx; then
    step bench_0.6b_ctx16k 600 "$bin/runtime/strata-bench-backend" --device cuda:0 \
        --shapes qwen3-0.6b --batch 1,4 --context 16384 --steps 8 --prefill 0 --dir /tmp --keep
fi
if has full; then step bench_gpu 3600 ./strata bench gpu; fi
echo "logs in $out"
exit "$failed"
