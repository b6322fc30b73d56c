/* CUDA MoE routing: one thread per token, the reference's code. */
#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/moe_route.h"
}

__global__ static void moe_route_kernel(int *experts, float *weights, const float *router_logits,
                                        int renormalize, int num_experts, int top_k, int n) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= n) return;
    experts += (size_t)row * (size_t)top_k;
    weights += (size_t)row * (size_t)top_k;
    router_logits += (size_t)row * (size_t)num_experts;
    float max = router_logits[0];
    for (int e = 1; e < num_experts; ++e)
        if (router_logits[e] > max) max = router_logits[e];
    float sum = 0.0f;
    for (int e = 0; e < num_experts; ++e)
        sum = __fadd_rn(sum, expf(__fsub_rn(router_logits[e], max)));
    const float inv = __fdiv_rn(1.0f, sum);
    for (int t = 0; t < top_k; ++t) {
        int best = -1;
        float best_p = 0.0f;
        for (int e = 0; e < num_experts; ++e) {
            int taken = 0;
            for (int u = 0; u < t; ++u)
                taken |= experts[u] == e;
            if (taken) continue;
            const float p = __fmul_rn(expf(__fsub_rn(router_logits[e], max)), inv);
            if (best < 0 || p > best_p) {
                best = e;
                best_p = p;
            }
        }
        experts[t] = best;
        weights[t] = best_p;
    }
    if (renormalize) {
        float total = 0.0f;
        for (int t = 0; t < top_k; ++t)
            total = __fadd_rn(total, weights[t]);
        for (int t = 0; t < top_k; ++t)
            weights[t] = __fdiv_rn(weights[t], total);
    }
}

static const int kThreads = 64;

extern "C" int cuda_moe_route_rows(int *experts, float *weights, const float *router_logits,
                                   int renormalize, int num_experts, int top_k, int n,
                                   void *stream) {
    if (num_experts <= 0 || top_k <= 0 || top_k > num_experts || n < 0 ||
        (n > 0 && (!experts || !weights || !router_logits)))
        return strata_set_error(STRATA_EINVAL,
                                "cuda_moe_route: bad arguments (E %d, top-k %d, %d rows)",
                                num_experts, top_k, n);
    if (n == 0) return STRATA_OK;
    moe_route_kernel<<<cuda_blocks_for(n, kThreads), kThreads, 0, (cudaStream_t)stream>>>(
        experts, weights, router_logits, renormalize, num_experts, top_k, n);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}

extern "C" int cuda_moe_route(int *experts, float *weights, const float *router_logits,
                              int renormalize, int num_experts, int top_k, void *stream) {
    if (!experts || !weights || !router_logits)
        return strata_set_error(STRATA_EINVAL, "cuda_moe_route: bad arguments (E %d, top-k %d)",
                                num_experts, top_k);
    return cuda_moe_route_rows(experts, weights, router_logits, renormalize, num_experts, top_k, 1,
                               stream);
}
