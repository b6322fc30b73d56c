/* Weighted scatter-add of one expert's rows: one thread per element, a grid row per token.
 * The MoE sum (cuda_moe_expert_sum): a block per (row, 256 columns); thread 0 lists the
 * row's held slots in ascending expert order in shared memory, then every thread walks the
 * row's halving tree over expert indices for its column with an explicit stack (post-order:
 * left subtree, right subtree, left + right), the reference's additions exactly. The tree's
 * shape is the row's, so the walk is uniform across the block. */
#include <stdint.h>
#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/moe_combine.h"
#include "runtime/base/op_contract.h"
}

static const int kThreads = 256;

__global__ static void moe_combine_kernel(float *out, const float *y, const int32_t *rows,
                                          const float *weights, int dim) {
    const int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= dim) return;
    const int j = blockIdx.y;
    float *o = out + (size_t)rows[j] * (size_t)dim;
    o[d] = __fadd_rn(o[d], __fmul_rn(y[(size_t)j * (size_t)dim + d], weights[j]));
}

extern "C" int cuda_moe_combine(float *out, const float *y, const int32_t *rows,
                                const float *weights, int count, int dim, void *stream) {
    if (count < 0 || count > 65535 || dim <= 0 || (count > 0 && (!out || !y || !rows || !weights)))
        return strata_set_error(STRATA_EINVAL, "cuda_moe_combine: bad arguments (count %d, dim %d)",
                                count, dim);
    if (count == 0) return STRATA_OK;
    dim3 grid(cuda_blocks_for(dim, kThreads), (unsigned)count);
    moe_combine_kernel<<<grid, kThreads, 0, (cudaStream_t)stream>>>(out, y, rows, weights, dim);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

/* Frames of the tree walk: the interval halves at each level, so ceil(log2(range)) + 1 of
 * them cover an expert range of up to 2^(kMaxDepth - 2). */
static const int kMaxDepth = 24;

struct TreeFrame {
    int lo, hi; /* the node's slots [lo, hi) of the row's sorted list */
    int a, b;   /* its expert interval */
    int s;      /* the split: slots [lo, s) left, [s, hi) right */
    int stage;  /* 0: not entered, 1: left pending, 2: right pending */
    float left;
};

__global__ static void moe_expert_sum_kernel(float *out, const float *y, const int32_t *slot_pos,
                                             const int *experts, const float *weights, int top_k,
                                             int lo_e, int hi_e, int dim) {
    __shared__ int ex[OPS_MOE_MAX_TOP_K], pos[OPS_MOE_MAX_TOP_K], count;
    __shared__ float wt[OPS_MOE_MAX_TOP_K];
    const int i = blockIdx.y, d = blockIdx.x * blockDim.x + threadIdx.x;
    if (threadIdx.x == 0) { /* held slots by ascending expert (insertion: moe_sum_rows) */
        int c = 0;
        for (int t = 0; t < top_k; ++t) {
            const size_t slot = (size_t)i * (size_t)top_k + (size_t)t;
            const int e = experts[slot];
            if (e < lo_e || e >= hi_e) continue;
            int at = c++;
            for (; at > 0 && ex[at - 1] > e; --at) {
                ex[at] = ex[at - 1];
                pos[at] = pos[at - 1];
                wt[at] = wt[at - 1];
            }
            ex[at] = e;
            pos[at] = slot_pos[slot];
            wt[at] = weights[slot];
        }
        count = c;
    }
    __syncthreads();
    if (d >= dim) return;
    float *o = out + (size_t)i * (size_t)dim + d;
    if (count == 0) {
        *o = 0.0f;
        return;
    }
    TreeFrame st[kMaxDepth];
    int top = 0;
    float ret = 0.0f;
    st[0] = {0, count, lo_e, hi_e, 0, 0, 0.0f};
    for (;;) {
        TreeFrame &f = st[top];
        if (f.stage == 0) {
            int s = f.lo;
            while (f.hi - f.lo > 1) { /* one half empty: descend into the other */
                const int mid = f.a + (f.b - f.a) / 2;
                s = f.lo;
                while (s < f.hi && ex[s] < mid)
                    ++s;
                if (s == f.lo)
                    f.a = mid;
                else if (s == f.hi)
                    f.b = mid;
                else
                    break;
            }
            if (f.hi - f.lo > 1) {
                f.s = s;
                f.stage = 1;
                st[top + 1] = {f.lo, s, f.a, f.a + (f.b - f.a) / 2, 0, 0, 0.0f};
                ++top;
                continue;
            }
            /* a leaf: the weighted slot (the reference's y *= w) */
            ret = __fmul_rn(y[(size_t)pos[f.lo] * (size_t)dim + d], wt[f.lo]);
        } else if (f.stage == 1) {
            f.left = ret;
            f.stage = 2;
            st[top + 1] = {f.s, f.hi, f.a + (f.b - f.a) / 2, f.b, 0, 0, 0.0f};
            ++top;
            continue;
        } else {
            ret = __fadd_rn(f.left, ret); /* slot ids[0] += slot ids[s] */
        }
        if (top == 0) break;
        --top;
    }
    *o = ret;
}

extern "C" int cuda_moe_expert_sum(float *out, const float *y, const int32_t *slot_pos,
                                   const int *experts, const float *weights, int n, int top_k,
                                   int experts_lo, int experts_hi, int dim, void *stream) {
    if (n < 0 || top_k <= 0 || top_k > OPS_MOE_MAX_TOP_K || dim <= 0 || experts_lo < 0 ||
        experts_lo > experts_hi || experts_hi - experts_lo > (1 << (kMaxDepth - 2)) ||
        (n > 0 && (!out || !y || !slot_pos || !experts || !weights)))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_moe_expert_sum: bad arguments (%d rows, top-k %d, experts "
                                "[%d, %d), dim %d)",
                                n, top_k, experts_lo, experts_hi, dim);
    for (int i0 = 0; i0 < n; i0 += 65535) { /* grid rows: at most 65535 per launch */
        const int rows = n - i0 < 65535 ? n - i0 : 65535;
        const size_t slot0 = (size_t)i0 * (size_t)top_k;
        dim3 grid(cuda_blocks_for(dim, kThreads), (unsigned)rows);
        moe_expert_sum_kernel<<<grid, kThreads, 0, (cudaStream_t)stream>>>(
            out + (size_t)i0 * (size_t)dim, y, slot_pos + slot0, experts + slot0, weights + slot0,
            top_k, experts_lo, experts_hi, dim);
        CUDA_CHECK_LAUNCH();
    }
    return STRATA_OK;
}
