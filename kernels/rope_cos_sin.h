/* CUDA twin of reference/ops.h rope_cos_sin (naming convention: kernels/README.md).
 * Plain C header: no CUDA types. */
#ifndef STRATA_KERNELS_ROPE_COS_SIN_H
#define STRATA_KERNELS_ROPE_COS_SIN_H

/* cos_out/sin_out [half] of one token: angle f[j] = pos_j * inv_freq[j] (fp32 product) with
 * pos_j = pos_t, except with M-RoPE (mrope_section != NULL, spec §5.1 interleaved):
 * j % 3 == 1 && j < 3*section[1] takes pos_h, j % 3 == 2 && j < 3*section[2] takes pos_w.
 * inv_freq [half] and mrope_section [3] (or NULL) are device pointers like the outputs.
 * The angle is bitwise the reference's; cosf/sinf are CUDA's (within 2 ulp of glibc's), so
 * the stage backend builds its tables on the host with the reference op instead and this
 * twin is for device-side use and the harness. Asynchronous on `stream`; 0 or
 * STRATA_EINVAL / STRATA_EDEVICE. */
int cuda_rope_cos_sin(float *cos_out, float *sin_out, const float *inv_freq, int pos_t, int pos_h,
                      int pos_w, const int *mrope_section, int half, void *stream);

#endif
