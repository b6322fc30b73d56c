/* The Qwen3-VL vision tower on a CUDA device: reference/vision_encoder.c's forward pass,
 * op for op, with the kernels/ twins (cuda_matmul, cuda_layernorm, cuda_add_bias,
 * cuda_gelu_tanh / _erf, cuda_rope_apply_rows, cuda_vision_attention, cuda_vec_add). The
 * weights are the CPU encoder's, uploaded once (bf16 / f32 as loaded); the position
 * embedding, the 2-D rotary tables and cu_seqlens are computed on the host by the reference
 * ops (bitwise the CPU's) and copied up. Every launch goes to the legacy default stream in
 * the reference's order; one forward allocates its activations and frees them at the end.
 *
 * Numerics: the matmuls and the rotation are bitwise the reference's; LayerNorm, the GELUs
 * and attention's expf are NMSE-close (kernels/ops_vision.h), so the output is within 1e-4 of
 * the CPU encoder's (tests/runtime/stage:vision_cuda_test, and _cuda_cpu_test with the
 * kernels' own source run on the host). */
#ifndef STRATA_RUNTIME_STAGE_VISION_CUDA_H
#define STRATA_RUNTIME_STAGE_VISION_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "reference/vision_encoder.h"

struct vision_cuda; /* opaque */

/* Uploads the loaded CPU encoder's weights to device `device` (cuda_set_device). `enc`
 * stays the caller's and must outlive the result (its config and grid checks are used).
 * STRATA_EDEVICE without a usable device, STRATA_ENOMEM when the weights do not fit. */
int vision_cuda_open(struct vision_cuda **out, const struct vision_encoder *enc, int device);
void vision_cuda_free(struct vision_cuda *g); /* accepts NULL and a half-built one */
size_t vision_cuda_weight_bytes(const struct vision_cuda *g);

/* vision_encoder_forward's contract (host pointers in and out), computed on the device. */
int vision_cuda_forward(struct vision_cuda *g, float *embeds, float *deepstack,
                        const float *pixel_values, int64_t n_patches, const int64_t *grid_thw,
                        int n_grids);

#endif
