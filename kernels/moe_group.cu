/* Grouping routed tokens by expert in one block: each thread owns experts (e = thread +
 * k·blockDim), the ids are staged through shared memory a tile at a time, every thread
 * scans the tile for its expert (a broadcast read). Pass 1 counts, thread 0 turns the
 * counts into offsets, pass 2 writes each expert's positions in slot order. A decode step's
 * n·top_k ids are one tile; a long prefill rescans its tiles once per pass. */
#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/moe_group.h"
}

static const int kThreads = 1024;
static const int kTile = 2048;

__global__ static void moe_group_kernel(int32_t *offsets, int32_t *rows, int32_t *slot_pos,
                                        const int *experts, int slots, int top_k, int E, int lo,
                                        int hi) {
    __shared__ int tile[kTile];
    for (int pass = 0; pass < 2; ++pass) {
        for (int e0 = 0; e0 < E; e0 += blockDim.x) { /* uniform loops: the barriers */
            const int e = e0 + (int)threadIdx.x;
            const int held = e < E && e >= lo && e < hi;
            int at = pass && e < E ? offsets[e] : 0;
            for (int s0 = 0; s0 < slots; s0 += kTile) {
                const int m = min(kTile, slots - s0);
                __syncthreads();
                for (int j = threadIdx.x; j < m; j += blockDim.x)
                    tile[j] = experts[s0 + j];
                __syncthreads();
                if (!held) continue;
                for (int j = 0; j < m; ++j) {
                    if (tile[j] != e) continue;
                    if (pass) {
                        rows[at] = (s0 + j) / top_k;
                        slot_pos[s0 + j] = at;
                    }
                    at++;
                }
            }
            if (!pass && e < E) offsets[e + 1] = at; /* the count, for now */
        }
        __syncthreads();
        if (pass) break;
        if (threadIdx.x == 0) {
            offsets[0] = 0;
            for (int e = 0; e < E; ++e)
                offsets[e + 1] += offsets[e];
        }
        __syncthreads();
        const int total = offsets[E];
        for (int j = threadIdx.x; j < slots; j += blockDim.x) {
            const int e = experts[j];
            if (j >= total) rows[j] = 0;
            if (e < lo || e >= hi || e < 0 || e >= E) slot_pos[j] = -1;
        }
    }
}

extern "C" int cuda_moe_group(int32_t *offsets, int32_t *rows, int32_t *slot_pos,
                              const int *experts, int n, int top_k, int num_experts, int experts_lo,
                              int experts_hi, void *stream) {
    if (n < 0 || top_k <= 0 || num_experts <= 0 || experts_lo < 0 || experts_hi > num_experts ||
        experts_lo > experts_hi || (long long)n * top_k > 0x7fffffff || !offsets ||
        (n > 0 && (!rows || !slot_pos || !experts)))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_moe_group: bad arguments (%d rows, top-k %d, experts [%d, "
                                "%d) of %d)",
                                n, top_k, experts_lo, experts_hi, num_experts);
    moe_group_kernel<<<1, kThreads, 0, (cudaStream_t)stream>>>(
        offsets, rows, slot_pos, experts, n * top_k, top_k, num_experts, experts_lo, experts_hi);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
