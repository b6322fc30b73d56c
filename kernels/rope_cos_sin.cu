/* CUDA RoPE table of one token: one thread per frequency j. */
#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/rope_cos_sin.h"
}

static const int kThreads = 128;

__global__ static void rope_cos_sin_kernel(float *cos_out, float *sin_out, const float *inv_freq,
                                           int pos_t, int pos_h, int pos_w,
                                           const int *mrope_section, int half) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= half) return;
    int p = pos_t;
    if (mrope_section) {
        if (j % 3 == 1 && j < 3 * mrope_section[1])
            p = pos_h;
        else if (j % 3 == 2 && j < 3 * mrope_section[2])
            p = pos_w;
    }
    const float angle = __fmul_rn((float)p, inv_freq[j]);
    cos_out[j] = cosf(angle);
    sin_out[j] = sinf(angle);
}

extern "C" int cuda_rope_cos_sin(float *cos_out, float *sin_out, const float *inv_freq, int pos_t,
                                 int pos_h, int pos_w, const int *mrope_section, int half,
                                 void *stream) {
    if (half < 0 || (half > 0 && (!cos_out || !sin_out || !inv_freq)))
        return strata_set_error(STRATA_EINVAL, "cuda_rope_cos_sin: bad arguments (half %d)", half);
    if (half == 0) return STRATA_OK;
    rope_cos_sin_kernel<<<cuda_blocks_for(half, kThreads), kThreads, 0, (cudaStream_t)stream>>>(
        cos_out, sin_out, inv_freq, pos_t, pos_h, pos_w, mrope_section, half);
    CUDA_CHECK_LAUNCH();
    return STRATA_OK;
}
