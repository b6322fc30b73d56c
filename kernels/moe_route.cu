/* CUDA MoE routing of one token: a single thread, the reference's code. */
#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/moe_route.h"
}

__global__ static void moe_route_kernel(int *experts, float *weights, const float *router_logits,
                                        int renormalize, int num_experts, int top_k) {
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

extern "C" int cuda_moe_route(int *experts, float *weights, const float *router_logits,
                              int renormalize, int num_experts, int top_k, void *stream) {
    if (num_experts <= 0 || top_k <= 0 || top_k > num_experts || !experts || !weights ||
        !router_logits)
        return strata_set_error(STRATA_EINVAL, "cuda_moe_route: bad arguments (E %d, top-k %d)",
                                num_experts, top_k);
    moe_route_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(experts, weights, router_logits,
                                                        renormalize, num_experts, top_k);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
